package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"time"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitConflict = 75 // default for `run` when the lock is not obtained (EX_TEMPFAIL)
	exitLost     = 76 // `run`: the lease was lost and the command was stopped
)

const usage = `dlock: distributed locks on Redis

Usage:
  dlock run [flags] NAME -- COMMAND [ARGS...]   run a command while holding the lock NAME
                                                 (--read/--write: a read-write lock; --permits N:
                                                 one of N permits; several --lock: all of them)
  dlock status [flags] NAME                      show a lock: held or free, owner, TTL, token, waiters
  dlock list [flags] [PATTERN]                   list the locks under the prefix (glob PATTERN)
  dlock release --force [flags] NAME             break a lock; its holder stops, waiters go on
  dlock latch [flags] set|down|wait|status NAME [N]  a count-down latch for start-up ordering
  dlock demo [tickets|seckill|cron|counter|all]  replay the seed scenarios without and with a lock
  dlock version                                  print the version
  dlock help [COMMAND]                           this text, or a command's flags

Every command that talks to Redis takes:
  --redis URL     redis://, rediss://, unix://, redis+cluster://, redis+sentinel:// (default
                  $REDIS_URL; the demo starts a throwaway redis-server when neither is set);
                  repeated 3 times or more: a Redlock over independent masters (locks only)
  --prefix P      key prefix of the locks (default "dlock:")

Run 'dlock COMMAND -h' for a command's flags.
`

// run is the whole CLI: it parses args, writes results to stdout and diagnostics to stderr
// (as "dlock: error: ..." and "dlock: hint: ..."), and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		if len(rest) == 1 && rest[0] != "help" {
			return run([]string{rest[0], "-h"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	case "version", "--version":
		fmt.Fprintln(stdout, "dlock", version())
		return exitOK
	case "run":
		return runCommand(rest, stdout, stderr)
	case "status":
		return report(statusCommand(rest, stdout, stderr), stderr)
	case "list":
		return report(listCommand(rest, stdout, stderr), stderr)
	case "release":
		return report(releaseCommand(rest, stdout, stderr), stderr)
	case "latch":
		return report(latchCommand(rest, stdout, stderr), stderr)
	case "demo":
		return report(runDemo(rest, stdout, stderr), stderr)
	case workerCommand:
		return report(runWorker(rest), stderr)
	}
	return report(usageError{fmt.Sprintf("unknown command %q", cmd), "run 'dlock help' for the commands"}, stderr)
}

// commonFlags are the flags of every command that talks to Redis.
type commonFlags struct {
	redis  nameList // one URL, or a Redlock's masters
	prefix string
}

func newFlagSet(name, synopsis string, stderr io.Writer) (*flag.FlagSet, *commonFlags) {
	fs := flag.NewFlagSet("dlock "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &commonFlags{}
	fs.Var(&c.redis, "redis", "Redis URL (default $REDIS_URL); repeat it, 3 times or more, for a Redlock over independent masters")
	fs.StringVar(&c.prefix, "prefix", "dlock:", "key prefix of the locks")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: dlock %s\n\n", synopsis)
		fs.PrintDefaults()
	}
	return fs, c
}

// parse parses args, turning a flag error into a usageError (flag already printed it).
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error(), "run '" + fs.Name() + " -h' for its flags"}
	}
	return nil
}

// usageError is a mistake in the command line: exit code 2 and a hint.
type usageError struct{ msg, hint string }

func (e usageError) Error() string { return e.msg }

// hinted is an error with advice on what to do about it.
type hinted struct {
	err  error
	hint string
}

func (e hinted) Error() string { return e.err.Error() }
func (e hinted) Unwrap() error { return e.err }

func report(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintf(stderr, "dlock: error: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		if ue.hint != "" {
			fmt.Fprintf(stderr, "dlock: hint: %s\n", ue.hint)
		}
		return exitUsage
	}
	var h hinted
	if errors.As(err, &h) && h.hint != "" {
		fmt.Fprintf(stderr, "dlock: hint: %s\n", h.hint)
	}
	var ee exitErr
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitError
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// fmtTTL prints a remaining TTL for people.
func fmtTTL(d time.Duration) string {
	if d < 0 {
		return "no TTL"
	}
	return d.Round(time.Millisecond).String()
}
