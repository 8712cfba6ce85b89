package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/spf13/cobra"
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

// statusCmd is `dlock status NAME`.
func statusCmd(stdout io.Writer, cp *completer) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "status [flags] NAME",
		Short: "Show a lock: held or free, owner, TTL, fencing token, waiters",
		Long: `Show a lock's state in Redis: held or free, its owner, TTL, fencing token and waiters; a
read-write lock's readers, a semaphore's permits, a latch's count; for a Redlock, each
master's state. A free lock says whether it was used within the last minute; after that it
has no state in Redis at all, as if never taken.`,
		Example: "  dlock status orders:42\n  dlock status --json orders:42",
		Args:    exactArgs(1, "dlock status orders:42"),
	}
	common := addCommon(c)
	c.ValidArgsFunction = cp.lockNames(common)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.RunE = func(_ *cobra.Command, args []string) error { return status(stdout, common, args[0], asJSON) }
	return c
}

func status(stdout io.Writer, common *commonFlags, name string, asJSON bool) error {
	var info dlock.LockInfo
	err := withAdmin(common, func(ctx context.Context, dl *dlock.Client) (err error) {
		info, err = dl.Inspect(ctx, name)
		return err
	})
	if err != nil && len(info.Masters) == 0 {
		return err
	}
	// A Redlock's masters are shown even when too few answered: that is what to look at then.
	if asJSON {
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
		if info.Recent || info.Waiters > 0 {
			fmt.Fprintf(tw, "state:\tfree (used within the last minute)\n")
		} else {
			fmt.Fprintf(tw, "state:\tfree: no state in Redis (never taken, or idle past the clean-up window)\n")
		}
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

// listCmd is `dlock list [PATTERN]`.
func listCmd(stdout io.Writer, cp *completer) *cobra.Command {
	var asJSON, held bool
	c := &cobra.Command{
		Use:   "list [flags] [PATTERN]",
		Short: "List the locks under the prefix (glob PATTERN)",
		// Locks leave no state in Redis once free: list can only show what has some.
		Long: `List the locks that have state in Redis: held, waited for, or used within the last minute
(their op log). --held lists only those held now: by an owner, by readers, with permits
out, or a latch counting.`,
		Example: "  dlock list 'orders:*'\n  dlock list --held --json",
		Args:    rangeArgs(0, 1, "dlock list 'orders:*'"),
	}
	common := addCommon(c)
	c.ValidArgsFunction = cp.lockNames(common)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON, one object per line")
	c.Flags().BoolVar(&held, "held", false, "only the locks held now")
	c.RunE = func(_ *cobra.Command, args []string) error {
		pattern := ""
		if len(args) == 1 {
			pattern = args[0]
		}
		return list(stdout, common, pattern, asJSON, held)
	}
	return c
}

func list(stdout io.Writer, common *commonFlags, pattern string, asJSON, held bool) error {
	if common.redlock() {
		return notOnRedlock("list")
	}
	var locks []dlock.LockInfo
	err := withAdmin(common, func(ctx context.Context, dl *dlock.Client) (err error) {
		locks, err = dl.Locks(ctx, pattern)
		return err
	})
	if err != nil {
		return err
	}
	if held {
		locks = slices.DeleteFunc(locks, func(l dlock.LockInfo) bool { return !l.Held })
	}
	if asJSON {
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

// releaseCmd is `dlock release --force NAME`.
func releaseCmd(stdout io.Writer, cp *completer) *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:   "release --force [flags] NAME",
		Short: "Break a lock: its holder stops, waiters go on",
		Long: `Break a lock whoever holds it, for an operator: the holder's lease ends (a dlock run
holding it stops its command) and the next waiter gets it. Holders release their own
locks; this needs --force.`,
		Example: "  dlock release --force orders:42",
		Args:    exactArgs(1, "dlock release --force orders:42"),
	}
	common := addCommon(c)
	c.ValidArgsFunction = cp.lockNames(common)
	c.Flags().BoolVar(&force, "force", false, "break the lock whoever holds it (required)")
	c.RunE = func(_ *cobra.Command, args []string) error {
		if !force {
			return usageError{"release breaks another owner's lock: say --force", "holders release their own locks; this is for operators"}
		}
		return release(stdout, common, args[0])
	}
	return c
}

// releaseRedlock breaks a Redlock's lock master by master. It succeeds when the masters that
// broke it (or found it free) leave too few others for a quorum, which alone could still hold
// it; the others are named in a warning.
func releaseRedlock(common *commonFlags, name string) (broke bool, err error) {
	conn, err := connect(common.redis, false)
	if err != nil {
		return false, err
	}
	defer conn.close()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	// The Redlock's own checks first (a server given twice is no quorum): a bad set of masters
	// is refused as the other commands refuse it.
	// Its ctx is ended: the checks need no server, and a hung master must not hold them up.
	rl := conn.client(dlock.WithKeyPrefix(common.prefix))
	defer rl.Close(context.Background())
	checked, stop := context.WithCancel(ctx)
	stop()
	if _, err := rl.Inspect(checked, name); errors.Is(err, dlock.ErrInvalid) {
		return false, err
	}
	n := len(conn.masters)
	held := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range conn.masters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dl := dlock.New(m, dlock.WithKeyPrefix(common.prefix))
			defer dl.Close(context.Background())
			held[i], errs[i] = dl.ForceRelease(ctx, name)
		}()
	}
	wg.Wait()
	var failed []error
	for i, e := range errs {
		if e != nil {
			failed = append(failed, fmt.Errorf("master %d (%s): %w", i+1, shownURL(common.redis[i]), e))
		}
	}
	if quorum := n/2 + 1; len(failed) >= quorum {
		return false, fmt.Errorf("%d of %d masters could not break the lock, enough for a quorum still to hold it: %w", len(failed), n, errors.Join(failed...))
	}
	for _, e := range failed {
		fmt.Fprintf(warnings, "dlock: warning: %v; broken on the other masters, too few left for a quorum to hold it\n", e)
	}
	return slices.Contains(held, true), nil
}

func release(stdout io.Writer, common *commonFlags, name string) error {
	var broke bool
	var err error
	if common.redlock() {
		broke, err = releaseRedlock(common, name)
	} else {
		err = withAdmin(common, func(ctx context.Context, dl *dlock.Client) (err error) {
			broke, err = dl.ForceRelease(ctx, name)
			return err
		})
	}
	if err != nil {
		return err
	}
	if broke {
		fmt.Fprintf(stdout, "released %s\n", name)
	} else {
		fmt.Fprintf(stdout, "%s was not held\n", name)
	}
	return nil
}
