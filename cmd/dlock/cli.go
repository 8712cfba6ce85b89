package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

const usage = `dlock: distributed locks on Redis

Usage:
  dlock demo [tickets]     replay a seed scenario without and with a lock
  dlock version            print the version
  dlock help               this text

Connection (every command that talks to Redis):
  --redis URL              redis://, rediss:// or unix:// URL (default: $REDIS_URL; the demo
                           starts a throwaway redis-server when neither is set)
`

// run is the whole CLI: it parses args, writes results to stdout and diagnostics to stderr
// (as "dlock: error: ..." and "dlock: hint: ..."), and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "version", "--version":
		fmt.Fprintln(stdout, "dlock", version())
		return exitOK
	case "demo":
		err = runDemo(rest, stdout, stderr)
	case workerCommand:
		err = runWorker(rest)
	default:
		err = usageError{fmt.Sprintf("unknown command %q", cmd), "run 'dlock help' for the commands"}
	}
	return report(err, stderr)
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
	return exitError
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
