package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/spf13/cobra"
)

// latchCmd is `dlock latch set|down|wait|status NAME [N]`: a count-down latch for
// shell-scripted start-up ordering (loaders count down, the service waits).
func latchCmd(stdout io.Writer, cp *completer) *cobra.Command {
	var ttl, wait time.Duration
	c := &cobra.Command{
		Use:   "latch [flags] set NAME N | down NAME | wait NAME | status NAME",
		Short: "A count-down latch for start-up ordering",
		Long: `A count-down latch: set starts the latch NAME at N (exit 1 if it is counting already),
down counts it down by one, wait returns once it reaches zero (at once if it has no state),
status prints its count.

While Redis gives no answer, set and down send the same call again (it is applied once) for
up to 10 s; exit 69 then means the call may or may not have been applied: read the count
with status before running down again, which would count again.`,
		Example: "  dlock latch set warehouses-loaded 4\n  dlock latch down warehouses-loaded\n  dlock latch wait --wait 5m warehouses-loaded",
		Args: func(_ *cobra.Command, args []string) error {
			want := map[string]int{"set": 3, "down": 2, "wait": 2, "status": 2}
			if len(args) == 0 || want[args[0]] != len(args) {
				return usageError{"latch needs set NAME N, down NAME, wait NAME or status NAME", "dlock latch set warehouses-loaded 4"}
			}
			return nil
		},
	}
	common := addCommon(c)
	names := cp.lockNames(common)
	c.ValidArgsFunction = func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		switch len(args) {
		case 0:
			return []cobra.Completion{"set", "down", "wait", "status"}, cobra.ShellCompDirectiveNoFileComp
		case 1:
			return names(c, nil, toComplete)
		}
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c.Flags().DurationVar(&ttl, "ttl", dlock.DefaultLatchTTL, "set, down: an abandoned latch disappears this long after its last set or down")
	c.Flags().DurationVarP(&wait, "wait", "w", 0, "wait: give up after this long (default: wait forever; 0 looks once, as run --wait 0 tries once), exit 75")
	c.RunE = func(c *cobra.Command, args []string) error {
		if ttl <= 0 || wait < 0 {
			return usageError{"--ttl must be positive and --wait not negative", ""}
		}
		if wait == 0 && c.Flags().Changed("wait") {
			wait = lookOnce
		}
		return latch(stdout, common, args[0], args[1:], ttl, wait)
	}
	return c
}

func latch(stdout io.Writer, common *commonFlags, op string, rest []string, ttl, wait time.Duration) error {
	name := rest[0]
	if common.redlock() {
		return notOnRedlock("a latch")
	}
	n := 0
	if op == "set" {
		// Checked before Redis is: a count that can never work is a usage error (2), also
		// while Redis is down (69), which a script would retry.
		var err error
		if n, err = strconv.Atoi(rest[1]); err != nil || n < 1 {
			return usageError{fmt.Sprintf("latch set: count %q: must be a whole number of at least 1", rest[1]), "dlock latch set warehouses-loaded 4"}
		}
	}
	conn, err := connect(common.redis, false)
	if err != nil {
		return err
	}
	defer conn.close()
	dl := conn.client(dlock.WithKeyPrefix(common.prefix))
	defer dl.Close(context.Background())
	d := dl.Latch(name, dlock.WithTTL(ttl))
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	switch op {
	case "set":
		ok, err := d.TrySetCount(ctx, n)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("latch %q is counting already", name)
		}
		fmt.Fprintf(stdout, "latch %s set to %d\n", name, n)
	case "down":
		if err := d.CountDown(ctx); err != nil {
			return err
		}
		// A read of its own: the count-down may have used most of ctx, and it went down.
		rctx, rcancel := context.WithTimeout(context.Background(), adminTimeout)
		defer rcancel()
		return printCount(rctx, stdout, d)
	case "status":
		return printCount(ctx, stdout, d)
	case "wait":
		if wait == lookOnce {
			n, err := d.Count(ctx)
			switch {
			case err != nil:
				return err
			case n > 0:
				return exitErr{exitConflict, fmt.Errorf("latch %q not open (at %d)", name, n)}
			}
			fmt.Fprintf(stdout, "latch %s open\n", name)
			return nil
		}
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, forwarded...)
		defer signal.Stop(sigs)
		caught := make(chan os.Signal, 1) // a signal ends the wait: sent before the ctx ends
		base, stop := context.WithCancel(context.Background())
		defer stop()
		go func() {
			select {
			case sig := <-sigs:
				caught <- sig
				stop()
			case <-base.Done():
			}
		}()
		wctx := base
		if wait > 0 {
			// One look first, whatever the wait: a wait shorter than a round trip would end
			// before any read reached Redis, and call an open latch shut.
			if n, err := d.Count(base); err == nil && n == 0 {
				fmt.Fprintf(stdout, "latch %s open\n", name)
				return nil
			}
			var c context.CancelFunc
			wctx, c = context.WithTimeout(wctx, wait)
			defer c()
		}
		if err := d.Wait(wctx); err != nil {
			select {
			case sig := <-caught:
				return exitErr{128 + int(sig.(syscall.Signal)), fmt.Errorf("%v while waiting for latch %q", sig, name)}
			default:
			}
			switch {
			case errors.Is(err, dlock.ErrUnavailable):
				return err // Redis was down: not a latch that stayed closed
			case errors.Is(err, context.DeadlineExceeded):
				return exitErr{exitConflict, fmt.Errorf("latch %q not open after %v", name, wait)}
			}
			return err
		}
		fmt.Fprintf(stdout, "latch %s open\n", name)
	}
	return nil
}

// lookOnce is latch wait's --wait 0: look whether the latch is open, without waiting.
const lookOnce = time.Duration(-1)

// printCount prints the latch's count, or that it is open.
func printCount(ctx context.Context, stdout io.Writer, d *dlock.Latch) error {
	n, err := d.Count(ctx)
	if err != nil {
		return err
	}
	if n == 0 {
		fmt.Fprintf(stdout, "latch %s open (no count in Redis)\n", d.Name())
	} else {
		fmt.Fprintf(stdout, "latch %s at %d\n", d.Name(), n)
	}
	return nil
}
