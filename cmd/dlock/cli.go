package main

import (
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/spf13/cobra"
)

const rootHelp = `dlock takes Redis distributed locks from the shell: it runs a command while it holds a
lock (as flock(1) does on one machine), shows and breaks locks, counts down latches, and
replays the scenarios that show why locks are needed.

Every command that talks to Redis takes --redis URL: redis://, rediss://, unix://,
redis+cluster:// or redis+sentinel:// (default $REDIS_URL); repeated 3 times or more, a
Redlock over independent masters (locks only). The demo starts a throwaway redis-server when
neither is set.`

// run is the whole CLI: it parses args, writes results and requested help to stdout and
// diagnostics to stderr (as "dlock: error: ..." and "dlock: hint: ..."), and returns the exit
// code (see exitCodes).
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == workerCommand {
		return report(runWorker(args[1:]), stderr, defaultCodes)
	}
	warnings = stderr
	root := newRoot(args, stdout, stderr)
	if len(args) == 0 {
		root.SetOut(stderr) // not asked for: the usage goes with the error
		_ = root.Usage()
		return report(usageError{"no command given", "run 'dlock help' for the commands"}, stderr, defaultCodes)
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	return report(err, stderr, codesOf(cmd, args))
}

// newRoot builds the command tree for args. Each call builds a fresh one: flags hold their
// values.
func newRoot(args []string, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "dlock",
		Short:         "Redis distributed locks from the shell",
		Long:          rootHelp,
		Version:       version(),
		SilenceErrors: true, // report prints every error once, with its hint and exit code
		SilenceUsage:  true,
		// Without Args, cobra would answer an unknown command itself, before report sees it.
		Args: cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 || c.ArgsLenAtDash() == 0 {
				// `dlock --` or `dlock -- run`: the -- ends the flags of a command, and none was given.
				return usageError{"no command given before --", "run 'dlock help' for the commands"}
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := c.SuggestionsFor(args[0]); len(s) > 0 && args[0] != "" {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return usageError{msg, "run 'dlock help' for the commands"}
		},
	}
	root.SuggestionsMinimumDistance = 2
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("dlock {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{err.Error(), "run '" + c.CommandPath() + " -h' for its flags"}
	})
	completer := &completer{words: args}
	root.AddCommand(runCmd(stdout, stderr, completer), statusCmd(stdout, completer), listCmd(stdout, completer),
		releaseCmd(stdout, completer), latchCmd(stdout, completer), demoCmd(stdout, stderr), versionCmd(stdout))
	root.SetHelpCommand(helpCmd())
	usageCompletionCmd(root)
	return root
}

// helpCmd is `dlock help [COMMAND]`: the help asked for, on stdout; an unknown COMMAND is a
// usage error (cobra's own help command would print the root's help and succeed).
func helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "Help about any command",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			target, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return usageError{fmt.Sprintf("no help topic %q", strings.Join(args, " ")), "run 'dlock help' for the commands"}
			}
			return target.Help()
		},
		ValidArgsFunction: func(c *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			var names []cobra.Completion
			if len(args) == 0 {
				for _, sub := range c.Root().Commands() {
					if sub.IsAvailableCommand() {
						names = append(names, sub.Name())
					}
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
	}
}

// usageCompletionCmd makes `dlock completion` without a shell, with one it does not know, or
// with extra arguments a usage error: cobra's would print its help and succeed, and
// `dlock completion bsah > /etc/bash_completion.d/dlock` would install the help text.
func usageCompletionCmd(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	comp, _, err := root.Find([]string{"completion"})
	if err != nil || comp == root {
		return
	}
	comp.Args = cobra.ArbitraryArgs
	comp.RunE = func(c *cobra.Command, args []string) error {
		const hint = "dlock completion bash (or zsh, fish, powershell)"
		if len(args) == 0 {
			return usageError{"completion needs a shell", hint}
		}
		return usageError{fmt.Sprintf("no completion for shell %q", args[0]), hint}
	}
	for _, shell := range comp.Commands() {
		shell.Args = noArgs
	}
}

// versionCmd is `dlock version`.
func versionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print dlock's version, and the Go and go-redis it was built with",
		Args:  noArgs,
		Run: func(*cobra.Command, []string) {
			fmt.Fprintln(stdout, "dlock", version(), buildDetails())
		},
	}
}

// commonFlags are the flags of every command that talks to Redis.
type commonFlags struct {
	redis  []string // one URL, or a Redlock's masters
	prefix string
}

// redlock reports whether the flags name a Redlock's masters (--redis 3 times or more).
func (f *commonFlags) redlock() bool { return len(f.redis) >= 3 }

// notOnRedlock is the usage error of what a Redlock does not serve (it takes plain locks
// only), given before anything is dialled.
func notOnRedlock(what string) error {
	return usageError{what + " on a Redlock (--redis 3 times or more): it takes plain locks only", "give one --redis (a single deployment: a server, Cluster or Sentinel group)"}
}

// addCommon adds --redis and --prefix to c and returns where they land.
func addCommon(c *cobra.Command) *commonFlags {
	f := &commonFlags{}
	c.Flags().StringArrayVar(&f.redis, "redis", nil, "Redis URL (default $REDIS_URL); repeat it, 3 times or more, for a Redlock over independent masters")
	c.Flags().StringVar(&f.prefix, "prefix", "dlock:", "key prefix of the locks")
	return f
}

// noArgs, exactArgs and rangeArgs check a command's positional arguments, as usage errors.
func noArgs(c *cobra.Command, args []string) error { return rangeArgs(0, 0, "")(c, args) }

func exactArgs(n int, example string) cobra.PositionalArgs { return rangeArgs(n, n, example) }

func rangeArgs(lo, hi int, example string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) >= lo && len(args) <= hi {
			return nil
		}
		want := fmt.Sprintf("%d to %d arguments", lo, hi)
		switch {
		case hi == 0:
			want = "no arguments"
		case lo == hi:
			want = fmt.Sprintf("exactly %d argument(s)", lo)
		}
		hint := "usage: " + c.UseLine()
		if example != "" {
			hint = "for example: " + example
		}
		return usageError{fmt.Sprintf("%s takes %s, got %d", c.CommandPath(), want, len(args)), hint}
	}
}

// usageError is a mistake in the command line: the usage exit code and a hint.
type usageError struct{ msg, hint string }

func (e usageError) Error() string { return e.msg }

// hinted is an error with advice on what to do about it.
type hinted struct {
	err  error
	hint string
}

func (e hinted) Error() string { return e.err.Error() }
func (e hinted) Unwrap() error { return e.err }

// exitErr is an error with its own exit code: the command's own, 126/127, a signal's 128+N, a
// latch wait's timeout.
type exitErr struct {
	code int
	err  error
}

func (e exitErr) Error() string { return e.err.Error() }
func (e exitErr) Unwrap() error { return e.err }

// unreachable marks an error of reaching Redis, so it exits with the unavailable code as
// dlock.ErrUnavailable does.
type unreachable struct{ err error }

func (e unreachable) Error() string        { return e.err.Error() }
func (e unreachable) Unwrap() error        { return e.err }
func (e unreachable) Is(target error) bool { return target == dlock.ErrUnavailable }

// report prints err (nil: nothing) as one "dlock: error:" line and its hint, and returns the
// exit code codes gives its kind.
func report(err error, stderr io.Writer, codes exitCodes) int {
	if err == nil {
		return exitOK
	}
	var silent quietErr
	if !errors.As(err, &silent) {
		fmt.Fprintf(stderr, "dlock: error: %v\n", err)
	}
	var ue usageError
	if errors.As(err, &ue) {
		if ue.hint != "" {
			fmt.Fprintf(stderr, "dlock: hint: %s\n", ue.hint)
		}
		return codes.usage
	}
	var h hinted
	if errors.As(err, &h) && h.hint != "" {
		fmt.Fprintf(stderr, "dlock: hint: %s\n", h.hint)
	}
	// Redis being down outranks what it caused: a wait that ran out while Redis did not
	// answer matches ErrNotObtained too, and is no conflict.
	var ee exitErr
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, dlock.ErrUnavailable):
		return codes.unavailable
	case errors.Is(err, dlock.ErrLeaseLost):
		return codes.lost
	case errors.Is(err, dlock.ErrNotObtained):
		return codes.conflict
	case errors.Is(err, dlock.ErrIncompatible):
		return codes.err // the server cannot do what was asked (WAITAOF on Redis 7.0, ...)
	case errors.Is(err, dlock.ErrInvalid):
		return codes.usage // a bad lock name, found by the library
	}
	return codes.err
}

// quietErr is an error report prints no line for (run --quiet's conflict): its exit code
// says it.
type quietErr struct{ err error }

func (e quietErr) Error() string { return e.err.Error() }
func (e quietErr) Unwrap() error { return e.err }

// version is the module version from the build info: the tag for `go install ...@vX`, a
// pseudo-version stamped from the VCS for a build in a checkout.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok || bi.Main.Version == "" {
		return "(devel)"
	}
	v := bi.Main.Version
	if v == "(devel)" {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v += " " + s.Value[:min(len(s.Value), 12)]
			case "vcs.modified":
				if s.Value == "true" {
					v += "+dirty"
				}
			}
		}
	}
	return v
}

// buildDetails names the Go release and the library versions in the binary.
func buildDetails() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	parts := []string{bi.GoVersion}
	for _, d := range bi.Deps {
		switch d.Path {
		case "github.com/dlock-go/dlock":
			if d.Replace != nil {
				parts = append(parts, "library from "+d.Replace.Path)
			} else {
				parts = append(parts, "library "+d.Version)
			}
		case "github.com/redis/go-redis/v9":
			parts = append(parts, "go-redis "+d.Version)
		}
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// fmtTTL prints a remaining TTL for people.
func fmtTTL(d time.Duration) string {
	if d < 0 {
		return "no TTL"
	}
	return d.Round(time.Millisecond).String()
}
