package main

import (
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes. A wrapper (cron, systemd, a CI step) tells dlock's own outcomes from the
// command's by these; `dlock run -h` lists them and --exit-code-base moves dlock's own out of
// the command's range. Conflict and lost come from sysexits.h (EX_TEMPFAIL and the code after
// it), unavailable is EX_UNAVAILABLE; 126 and 127 are what shells return.
const (
	exitOK          = 0
	exitError       = 1 // dlock failed otherwise (Redis refused: NOPERM, an old server, ...)
	exitUsage       = 2
	exitUnavailable = 69 // Redis did not answer, or answered that it cannot serve (LOADING, ...)
	exitConflict    = 75 // the lock was not obtained: held, or not within --wait
	exitLost        = 76 // the lease was lost while the command ran; the command was stopped
	exitCannotExec  = 126
	exitNotFound    = 127
)

// exitCodes are dlock's own exit codes for one invocation.
type exitCodes struct{ err, usage, unavailable, conflict, lost int }

var defaultCodes = exitCodes{exitError, exitUsage, exitUnavailable, exitConflict, exitLost}

// withBase is the codes moved by --exit-code-base B: B, B+1, ... in exitCodes' order.
func withBase(b int) exitCodes { return exitCodes{b, b + 1, b + 2, b + 3, b + 4} }

// maxExitBase keeps the last moved code (lost, B+4) a valid exit status.
const maxExitBase = 255 - 4

// codesOf is the codes for the invocation args, which ran cmd: moved by run's
// --exit-code-base and -E/--conflict-exit-code when they have valid values.
func codesOf(cmd *cobra.Command, args []string) exitCodes {
	codes := defaultCodes
	if cmd == nil || cmd.Name() != "run" {
		return codes
	}
	if b, ok := intFlag(cmd, args, "exit-code-base", ""); ok && validExitBase(b) {
		codes = withBase(b)
	}
	if c, ok := intFlag(cmd, args, "conflict-exit-code", "E"); ok && validExitCode(c) {
		codes.conflict = c
	}
	return codes
}

// intFlag is the value of cmd's int flag long (shorthand short): as parsed, or read from args
// (up to --) when parsing stopped before it, at a usage error earlier on the line, so that
// the usage code does not depend on the order of the flags.
func intFlag(cmd *cobra.Command, args []string, long, short string) (int, bool) {
	if f := cmd.Flags().Lookup(long); f != nil && f.Changed {
		n, err := strconv.Atoi(f.Value.String())
		return n, err == nil
	}
	for i, a := range args {
		var v string
		switch {
		case a == "--":
			return 0, false
		case a == "--"+long || (short != "" && a == "-"+short):
			if i+1 < len(args) {
				v = args[i+1]
			}
		case strings.HasPrefix(a, "--"+long+"="):
			v = strings.TrimPrefix(a, "--"+long+"=")
		case short != "" && strings.HasPrefix(a, "-"+short):
			v = strings.TrimPrefix(strings.TrimPrefix(a, "-"+short), "=") // -E9, -E=9
		default:
			continue
		}
		n, err := strconv.Atoi(v)
		return n, err == nil
	}
	return 0, false
}

// validExitBase and validExitCode are the ranges --exit-code-base and --conflict-exit-code
// accept.
func validExitBase(b int) bool { return b >= 1 && b <= maxExitBase }
func validExitCode(c int) bool { return c >= 0 && c <= 255 }

// exitCodesHelp ends `dlock run -h`.
const exitCodesHelp = `
Exit codes:
  the command's own      passed through; 128+N if signal N ended it
  1                      dlock failed (Redis refused the call: no permission, too old, ...)
  2                      usage: a bad flag, value or argument; nothing was locked or run
  69                     Redis unreachable, or unable to serve; the command did not run
  75                     conflict: the lock is held (--wait 0, --no-wait) or --wait ran out;
                         --conflict-exit-code changes it
  76                     the lease was lost while the command ran: it was stopped (SIGTERM,
                         SIGKILL after --grace)
  126, 127               the command cannot be executed, or was not found (as in a shell);
                         checked before the lock is taken, as far as a look at the file can
  128+N                  signal N ended the wait for the lock
With --exit-code-base B, dlock's own codes become B (failed), B+1 (usage), B+2 (unreachable),
B+3 (conflict) and B+4 (lost), out of the command's range: --exit-code-base 200 gives 200-204.
`
