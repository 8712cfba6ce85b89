package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock"
)

const adminTimeout = 10 * time.Second

// withAdmin connects and runs f with a dlock Client, bounded by adminTimeout.
func withAdmin(c *commonFlags, f func(ctx context.Context, dl *dlock.Client) error) error {
	conn, err := connect(c.redis, false)
	if err != nil {
		return err
	}
	defer conn.close()
	dl := conn.client(dlock.WithKeyPrefix(c.prefix))
	defer dl.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	return f(ctx, dl)
}

func statusCommand(args []string, stdout, stderr io.Writer) error {
	fs, common := newFlagSet("status", "status [--redis URL] [--prefix P] [--json] NAME", stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{"status takes exactly one lock NAME", "dlock status orders:42"}
	}
	var info dlock.LockInfo
	err := withAdmin(common, func(ctx context.Context, dl *dlock.Client) (err error) {
		info, err = dl.Inspect(ctx, fs.Arg(0))
		return err
	})
	if err != nil && len(info.Masters) == 0 {
		return err
	}
	// A Redlock's masters are shown even when too few answered: that is what to look at then.
	if *asJSON {
		return cmpOr(json.NewEncoder(stdout).Encode(info), err)
	}
	defer func() {
		if len(info.Masters) > 0 {
			printMasters(stdout, info.Masters)
		}
	}()
	tw := tabwriter.NewWriter(stdout, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", info.Name)
	switch {
	case info.Foreign:
		fmt.Fprintf(tw, "state:\theld by a key dlock did not write (another type, or another dlock version)\nttl:\t%s\n", fmtTTL(info.TTL))
	case info.Held && info.Kind == "latch":
		fmt.Fprintf(tw, "kind:\tlatch\nstate:\tcounting: %d\nttl:\t%s\n", info.Count, fmtTTL(info.TTL))
	case info.Held && info.Kind == "semaphore":
		fmt.Fprintf(tw, "kind:\tsemaphore\nstate:\t%d of %d permits out, %d free, %d holders\nttl:\t%s\ntoken:\t%d\n",
			info.PermitsOut, info.Permits, max(info.Permits-info.PermitsOut, 0), info.Readers, fmtTTL(info.TTL), info.Token)
	case info.Held && info.Readers > 0:
		fmt.Fprintf(tw, "kind:\tread-write lock\nstate:\tread by %d owners\nttl:\t%s\ntoken:\t%d\n", info.Readers, fmtTTL(info.TTL), info.Token)
	case info.Held:
		if info.Kind == "rwmutex" {
			fmt.Fprintf(tw, "kind:\tread-write lock\n")
		}
		fmt.Fprintf(tw, "state:\theld\nowner:\t%s\nhold count:\t%d\nttl:\t%s\ntoken:\t%d\n", info.Owner, info.HoldCount, fmtTTL(info.TTL), info.Token)
	default:
		fmt.Fprintf(tw, "state:\tfree (no state in Redis)\n")
	}
	fmt.Fprintf(tw, "waiters:\t%d\n", info.Waiters)
	return cmpOr(tw.Flush(), err)
}

// printMasters shows a Redlock lock's state on each master.
func printMasters(w io.Writer, masters []dlock.LockInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\nMASTER\tSTATE\tOWNER\tTTL\tTOKEN\tWAITERS\n")
	for _, m := range masters {
		state, owner, ttl := "free", "-", "-"
		switch {
		case m.Error != "":
			state = "unreachable: " + m.Error
		case m.Foreign:
			state, ttl = "foreign", fmtTTL(m.TTL)
		case m.Held:
			state, owner, ttl = "held", m.Owner, fmtTTL(m.TTL)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", m.Master, state, owner, ttl, m.Token, m.Waiters)
	}
	_ = tw.Flush()
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func listCommand(args []string, stdout, stderr io.Writer) error {
	// Locks leave no state in Redis once free: list shows the held ones, those with waiters,
	// and those used within the last minute (their op log), and says so in its help.
	fs, common := newFlagSet("list", "list [--redis URL] [--prefix P] [--json] [PATTERN]\n\nLists the locks that have state in Redis: held, waited for, or used within the last minute.", stderr)
	asJSON := fs.Bool("json", false, "print JSON, one object per line")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return usageError{"list takes at most one PATTERN", "dlock list 'orders:*'"}
	}
	var locks []dlock.LockInfo
	err := withAdmin(common, func(ctx context.Context, dl *dlock.Client) (err error) {
		locks, err = dl.Locks(ctx, fs.Arg(0))
		return err
	})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, l := range locks {
			if err := enc.Encode(l); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tOWNER\tTTL\tTOKEN\tWAITERS")
	for _, l := range locks {
		state, owner, ttl := "free", "-", "-"
		switch {
		case l.Foreign:
			state, ttl = "foreign", fmtTTL(l.TTL)
		case l.Held && l.Kind == "latch":
			state, owner, ttl = fmt.Sprintf("latch at %d", l.Count), "-", fmtTTL(l.TTL)
		case l.Held && l.Kind == "semaphore":
			state, owner, ttl = fmt.Sprintf("%d/%d permits", l.PermitsOut, l.Permits), fmt.Sprintf("%d holders", l.Readers), fmtTTL(l.TTL)
		case l.Held && l.Readers > 0:
			state, owner, ttl = "read", fmt.Sprintf("%d readers", l.Readers), fmtTTL(l.TTL)
		case l.Held && l.Kind == "rwmutex":
			state, owner, ttl = "written", l.Owner, fmtTTL(l.TTL)
		case l.Held:
			state, owner, ttl = "held", l.Owner, fmtTTL(l.TTL)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", l.Name, state, owner, ttl, l.Token, l.Waiters)
	}
	return tw.Flush()
}

func releaseCommand(args []string, stdout, stderr io.Writer) error {
	fs, common := newFlagSet("release", "release --force [--redis URL] [--prefix P] NAME", stderr)
	force := fs.Bool("force", false, "break the lock whoever holds it (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{"release takes exactly one lock NAME", "dlock release --force orders:42"}
	}
	if !*force {
		return usageError{"release breaks another owner's lock: say --force", "holders release their own locks; this is for operators"}
	}
	var broke bool
	err := withAdmin(common, func(ctx context.Context, dl *dlock.Client) (err error) {
		broke, err = dl.ForceRelease(ctx, fs.Arg(0))
		return err
	})
	if err != nil {
		return err
	}
	if broke {
		fmt.Fprintf(stdout, "released %s\n", fs.Arg(0))
	} else {
		fmt.Fprintf(stdout, "%s was not held\n", fs.Arg(0))
	}
	return nil
}
