package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// runCmd is `dlock run`: take the lock, run the command while renewing it, release it, and
// exit with the command's code. If the lease is lost the command gets SIGTERM, then SIGKILL
// after --grace, and dlock exits with the lost code.
func runCmd(stdout, stderr io.Writer, cp *completer) *cobra.Command {
	o := &runOpts{}
	c := &cobra.Command{
		Use:   "run [flags] NAME -- COMMAND [ARGS...]",
		Short: "Run a command while holding a lock",
		Long: `Run COMMAND while holding the lock NAME, renewing it every TTL/4, and release it when the
command exits (not run from a terminal: when the last process of its process group exits, so
children it left in the background keep the lock, as with flock). Several --lock NAMEs (instead of NAME) are taken together, all or nothing;
--read or --write take NAME as a read-write lock; --permits N takes one of N permits.

Flags go anywhere before --; everything after -- is the command. The command sees
DLOCK_NAME, DLOCK_TOKEN (the fencing token; DLOCK_TOKENS for several locks) and DLOCK_OWNER.
Signals are forwarded to it (from a terminal, where it shares dlock's process group, Ctrl-C,
Ctrl-\ and a hang-up reach it directly and are not passed on again; Ctrl-Z stops it with
dlock); it is stopped if the lease is lost, and dies with dlock.`,
		Example: `  dlock run --wait 0 --quiet nightly-cleanup -- /usr/local/bin/cleanup --all
  dlock run --permits 2 exports -- ./export-report
  dlock run --lock account:1 --lock account:2 -- ./transfer 1 2 100`,
		Args: func(c *cobra.Command, args []string) error { return o.positional(c, args) },
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.validate(c); err != nil {
				return err
			}
			return o.run(stdout, stderr)
		},
	}
	c.SetHelpTemplate(c.HelpTemplate() + exitCodesHelp)
	f := c.Flags()
	o.common = addCommon(c)
	c.ValidArgsFunction = cp.lockNames(o.common)
	f.DurationVarP(&o.wait, "wait", "w", 0, "give up after waiting this long for the lock; 0 tries once (default: wait forever)")
	f.BoolVarP(&o.noWait, "no-wait", "n", false, "try once, fail at once if the lock is held (same as --wait 0)")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "print nothing when the lock is held or --wait runs out (as flock -n)")
	f.DurationVar(&o.ttl, "ttl", dlock.DefaultTTL, "lease TTL, at least "+minRunTTL.String()+"; renewed every TTL/4 while the command runs")
	f.IntVarP(&o.conflict, "conflict-exit-code", "E", exitConflict, "exit code when the lock is not obtained (0-255)")
	f.IntVar(&o.exitBase, "exit-code-base", 0, "move dlock's own exit codes to B..B+4 (1-"+strconv.Itoa(maxExitBase)+"), out of the command's range")
	f.StringVar(&o.owner, "owner", "", "owner id (default: random); processes with the same id re-enter the lock")
	f.DurationVar(&o.grace, "grace", 10*time.Second, "time between SIGTERM and SIGKILL when the lease is lost; when Redis stops renewing it, SIGTERM comes this long (at most TTL/8) before the lease's end and SIGKILL at its end")
	f.BoolVar(&o.read, "read", false, "take NAME as a read-write lock, to read: shared with other --read runs")
	f.BoolVar(&o.write, "write", false, "take NAME as a read-write lock, to write: alone, excluding --read runs")
	f.IntVar(&o.permits, "permits", 0, "take one permit of NAME as a semaphore of this many (at least 1): at most that many runs at once")
	f.StringVar(&o.replicaAck, "replica-ack", "", "N[/TIMEOUT]: the lock counts only once N replicas acknowledged it, within TIMEOUT (default "+defaultAckTimeout.String()+")")
	f.StringVar(&o.replicaAckAOF, "replica-ack-aof", "", "[local+]N[/TIMEOUT] or local[/TIMEOUT]: as --replica-ack, but N replicas (and the master, with local) fsynced it to their AOF (WAITAOF, Redis 7.2+); TIMEOUT defaults to "+defaultAOFAckTimeout.String()+" (appendfsync everysec)")
	f.StringArrayVar(&o.locks, "lock", nil, "a lock to take, instead of NAME; repeat it: the locks are taken together, all or nothing")
	f.SortFlags = false
	_ = c.RegisterFlagCompletionFunc("lock", cp.flagLockNames(o.common))
	return c
}

// minRunTTL is run's shortest --ttl: a command's lease renewed every few milliseconds would
// be lost to one slow round trip (the library accepts down to 1ms, for tests).
const minRunTTL = time.Second

// runOpts is one `dlock run`: its flags, then its lock names and command.
type runOpts struct {
	common                      *commonFlags
	wait, ttl, grace            time.Duration
	noWait, quiet, read, write  bool
	waitGiven                   bool
	conflict, exitBase, permits int
	owner, replicaAck           string
	replicaAckAOF               string
	locks                       []string
	names, command              []string // set by positional
	ackN                        int
	ackTimeout                  time.Duration
	aofLocal                    bool
	aofN                        int
	aofTimeout                  time.Duration
}

// positional splits the arguments at -- into the lock NAME (or none, with --lock) and the
// command. The -- is required: a command's own flags would otherwise be read as dlock's.
func (o *runOpts) positional(c *cobra.Command, args []string) error {
	const example = "dlock run nightly-cleanup -- /usr/local/bin/cleanup --all"
	dash := c.ArgsLenAtDash()
	if dash < 0 {
		if len(args) == 0 {
			return usageError{"run needs a lock NAME, then -- and a COMMAND", example}
		}
		return usageError{"run needs -- between the lock NAME and the COMMAND", example}
	}
	before, command := args[:dash], args[dash:]
	switch {
	case len(o.locks) > 0 && len(before) > 0:
		return usageError{fmt.Sprintf("run takes the locks as NAME or as --lock, not both (NAME %q with --lock)", before[0]), "dlock run --lock a --lock b -- CMD"}
	case len(o.locks) > 0:
		o.names = o.locks
	case len(before) == 0:
		return usageError{"run needs a lock NAME before --", example}
	case len(before) > 1:
		return usageError{fmt.Sprintf("run takes one lock NAME before --, got %d (%s)", len(before), strings.Join(before, " ")), "several locks at once: dlock run --lock a --lock b -- CMD"}
	default:
		o.names = before
	}
	for i, n := range o.names {
		switch {
		case n == "":
			return usageError{"run: empty lock name", example}
		case slices.Contains(o.names[:i], n):
			return usageError{fmt.Sprintf("run: lock %q given twice", n), "each --lock names another lock"}
		case len(o.names) > 1 && strings.ContainsAny(n, ",="):
			// DLOCK_NAME and DLOCK_TOKENS list the locks as name=token,...: one name with a
			// comma would read as two.
			return usageError{fmt.Sprintf("run: lock %q: a lock of several --lock may not contain , or =", n), "DLOCK_TOKENS lists them as name=token,name=token"}
		}
	}
	if len(command) == 0 {
		return usageError{"run needs a COMMAND after --", example}
	}
	o.command = command
	return nil
}

// validate refuses contradictory and out-of-range flags, before anything touches Redis.
func (o *runOpts) validate(c *cobra.Command) error {
	given := func(name string) bool { return c.Flags().Changed(name) }
	// A flag is set when given, but a bool only when true: --read=false --write contradicts
	// nothing.
	set := func(name string) bool {
		f := c.Flags().Lookup(name)
		return f.Changed && (f.Value.Type() != "bool" || f.Value.String() == "true")
	}
	for _, pair := range [][2]string{{"read", "write"}, {"no-wait", "wait"}, {"replica-ack", "replica-ack-aof"},
		{"conflict-exit-code", "exit-code-base"}} {
		if set(pair[0]) && set(pair[1]) {
			return usageError{fmt.Sprintf("--%s and --%s exclude each other", pair[0], pair[1]), "run 'dlock run -h' for what each does"}
		}
	}
	switch {
	case o.wait < 0:
		return usageError{fmt.Sprintf("--wait %v: must not be negative (0 tries once)", o.wait), "dlock run --wait 30s NAME -- CMD"}
	case o.ttl < minRunTTL:
		return usageError{fmt.Sprintf("--ttl %v: must be at least %v", o.ttl, minRunTTL), "the default is " + dlock.DefaultTTL.String() + ", renewed while the command runs"}
	case o.grace < 0:
		return usageError{fmt.Sprintf("--grace %v: must not be negative", o.grace), ""}
	case !validExitCode(o.conflict):
		return usageError{fmt.Sprintf("--conflict-exit-code %d: must be 0-255", o.conflict), "an exit status is one byte"}
	case given("exit-code-base") && !validExitBase(o.exitBase):
		return usageError{fmt.Sprintf("--exit-code-base %d: must be 1-%d, so that B+4 is an exit status", o.exitBase, maxExitBase), "--exit-code-base 200 gives 200-204"}
	case given("permits") && (o.permits < 1 || o.permits > dlock.MaxPermits):
		return usageError{fmt.Sprintf("--permits %d: must be 1-%d", o.permits, dlock.MaxPermits), "dlock run --permits 2 exports -- ./export-report"}
	case len(o.names) > 1 && (o.read || o.write || o.permits > 0):
		return usageError{"--read, --write and --permits take one lock NAME, not several --lock", "dlock run --read config:pricing -- ./serve"}
	case o.permits > 0 && (o.read || o.write):
		return usageError{"--permits takes a semaphore, not a read-write lock: drop --read or --write", "dlock run --permits 2 exports -- ./export-report"}
	case o.common.redlock() && (o.read || o.write || o.permits > 0 || len(o.names) > 1):
		return notOnRedlock("--read, --write, --permits and several --lock")
	}
	o.waitGiven = given("wait")
	var err error
	if o.ackN, o.ackTimeout, err = parseReplicaAck(o.replicaAck); err != nil {
		return err
	}
	o.aofLocal, o.aofN, o.aofTimeout, err = parseReplicaAckAOF(o.replicaAckAOF)
	return err
}

// run takes the lock, runs the command and returns its outcome as an error report maps to
// an exit code (exitErr with the command's own code).
func (o *runOpts) run(stdout, stderr io.Writer) error {
	name := strings.Join(o.names, ",")
	// The command is found before the lock is taken: a typo in a crontab should not take the
	// lock, and exits 127 (126: found but not executable) as a shell would.
	if _, err := exec.LookPath(o.command[0]); err != nil {
		return execError(o.command[0], err)
	}
	conn, err := connect(o.common.redis, false)
	if err != nil {
		return err
	}
	defer conn.close()
	opts := []dlock.Option{dlock.WithKeyPrefix(o.common.prefix), dlock.WithTTL(o.ttl), dlock.WithoutCohort()}
	if o.owner != "" {
		opts = append(opts, dlock.WithOwner(o.owner))
	}
	if o.ackN > 0 {
		opts = append(opts, dlock.WithReplicaAck(o.ackN, o.ackTimeout))
	}
	if o.replicaAckAOF != "" {
		opts = append(opts, dlock.WithReplicaAckAOF(o.aofLocal, o.aofN, o.aofTimeout))
	}
	dl := conn.client(opts...)
	defer dl.Close(context.Background())
	var m locker = dl.Mutex(name)
	switch {
	case len(o.names) > 1:
		m = dl.MultiLock(o.names)
	case o.read:
		rw := dl.RWMutex(name)
		m = funcLocker{rw.RLock, rw.TryRLock}
	case o.write:
		m = dl.RWMutex(name)
	case o.permits > 0:
		sem := dl.Semaphore(name, o.permits)
		m = funcLocker{
			func(ctx context.Context) (*dlock.Lease, error) { return sem.Acquire(ctx, 1) },
			func(ctx context.Context) (*dlock.Lease, error) { return sem.TryAcquire(ctx, 1) },
		}
	}

	// Signals while waiting give up the wait; while the command runs they are forwarded.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	once := o.noWait || o.wait == 0 && o.waitGiven
	lease, sig, err := acquire(m, once, o.wait, sigs)
	if sig != nil {
		if lease != nil {
			_ = lease.Unlock(context.Background())
		}
		return exitErr{128 + int(sig.(syscall.Signal)), fmt.Errorf("%v while waiting for lock %q", sig, name)}
	}
	if err != nil {
		// Redis not answering is not a conflict, even when the wait ran out meanwhile.
		if !errors.Is(err, dlock.ErrUnavailable) && (errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, context.DeadlineExceeded)) {
			err = o.conflictError(name, err)
		}
		return err
	}
	cmd := exec.Command(o.command[0], o.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	// An inherited DLOCK_TOKEN (an outer `dlock run`) must not reach a command that holds
	// several locks, as if it were a token of its own.
	cmd.Env = append(withoutRunEnv(os.Environ()), "DLOCK_NAME="+name, "DLOCK_TOKENS="+tokensEnv(o.names, lease),
		"DLOCK_OWNER="+lease.Owner()) // the id `dlock status` shows
	if len(o.names) == 1 {
		cmd.Env = append(cmd.Env, "DLOCK_TOKEN="+strconv.FormatUint(lease.Token(), 10))
	}
	// The command dies with dlock, whatever kills dlock: it must never outlive the lock.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	group := !term.IsTerminal(int(os.Stdin.Fd()))
	if group {
		// Its own process group, so a lost lease stops the command's children too. Not from a
		// terminal: a background group reading it would be stopped (SIGTTIN) while the lock is
		// renewed forever.
		cmd.SysProcAttr.Setpgid = true
		// The command's orphans come to dlock, which reaps them (groupAlive): under a parent
		// that does not reap them (a PID 1 without an init), their zombies would count as
		// members of the group forever.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			_ = lease.Unlock(context.Background())
			return fmt.Errorf("run: become the command's subreaper: %w", err)
		}
	}
	// Ctrl-Z stops the terminal's foreground group: dlock alone when the command has a group
	// of its own. Stopped, dlock renews nothing, so the command is stopped with it (caught
	// from before the command starts, which may be the moment it comes).
	tstp := make(chan os.Signal, 1)
	if group && controllingTerminal() {
		// Only with a terminal to send it, whatever the redirections of dlock's own input and
		// output: elsewhere a SIGTSTP is a stray one (ignored by the kernel in an orphaned
		// group), which must not turn into a stop of dlock and the command.
		signal.Notify(tstp, syscall.SIGTSTP)
		defer signal.Stop(tstp)
	}
	started, exited := make(chan error, 1), make(chan error, 1)
	go func() {
		// Pdeathsig follows the thread that started the command: keep this goroutine on its
		// thread until the command has exited.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		_ = lease.Unlock(context.Background())
		return execError(o.command[0], err)
	}
	target := cmd.Process.Pid
	if group {
		target = -target
		reaping := make(chan struct{})
		defer close(reaping)
		go reapOrphans(cmd.Process.Pid, reaping)
	}

	// Renewals failing (Redis cut off): the command is stopped before the lease ends, SIGKILL
	// coming at its end, so it never runs on past the lock into the next holder's run.
	watching := make(chan struct{})
	defer close(watching)
	before := o.stopBefore()
	ending := leaseEnding(lease, before, max(before, o.ttl/2), watching)
	endingErr := func() error {
		return fmt.Errorf("lease on %q not renewed by Redis (%v left of it)", name, lease.Remaining().Round(time.Millisecond))
	}
	code := exitOK
	for done := false; !done; {
		select {
		case sig := <-sigs:
			if !group && fromTerminal[sig] && foreground() {
				// The command is in dlock's process group, the terminal's foreground one: it
				// got this one itself (a second SIGINT reads as "force quit" to many commands).
				continue
			}
			_ = syscall.Kill(target, sig.(syscall.Signal))
		case <-tstp:
			if !controllingTerminal() {
				// The terminal is gone (its session ended): nothing could continue dlock, and
				// this is a stray signal.
				continue
			}
			_ = syscall.Kill(target, syscall.SIGSTOP)
			stopSelf() // until the shell's fg or bg
			if lease.Remaining() <= before {
				// Lost or ending while stopped: stop the command (stop continues it to act on
				// SIGTERM), rather than leave it stopped on a lease that may renew again.
				fmt.Fprintf(stderr, "dlock: error: %v; stopping the command (SIGKILL when the lease ends)\n", endingErr())
				stop(target, exited, o.grace, lease.Done())
				return quietErr{leaseLost{endingErr()}}
			}
			_ = syscall.Kill(target, syscall.SIGCONT)
		case <-lease.Done():
			select {
			case err := <-exited:
				// The command had exited already: its own outcome (Unlock reports a loss).
				code, done = exitCode(err), true
				continue
			default:
			}
			// Said before the stop, which may take --grace: the reason comes first.
			fmt.Fprintf(stderr, "dlock: error: lease on %q lost (%v); stopping the command\n", name, lease.Err())
			stop(target, exited, o.grace, nil)
			return quietErr{leaseLost{lease.Err()}}
		case <-ending:
			select {
			case err := <-exited: // the command had exited already: its own outcome
				code, done = exitCode(err), true
				continue
			default:
			}
			fmt.Fprintf(stderr, "dlock: error: %v; stopping the command (SIGKILL when the lease ends)\n", endingErr())
			stop(target, exited, o.grace, lease.Done())
			return quietErr{leaseLost{endingErr()}}
		case err := <-exited:
			code = exitCode(err)
			done = true
		}
	}
	if group {
		switch waitGroup(target, lease, ending, sigs) {
		case groupLost:
			fmt.Fprintf(stderr, "dlock: error: lease on %q lost (%v) while the command's children ran; stopping them\n", name, lease.Err())
			stop(target, leaderGone, o.grace, nil)
			return quietErr{leaseLost{lease.Err()}}
		case groupEnding:
			fmt.Fprintf(stderr, "dlock: error: %v while the command's children ran; stopping them (SIGKILL when the lease ends)\n", endingErr())
			stop(target, leaderGone, o.grace, lease.Done())
			return quietErr{leaseLost{endingErr()}}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lease.Unlock(ctx); err != nil {
		fmt.Fprintf(stderr, "dlock: error: release %q: %v\n", name, err)
		if code == exitOK && errors.Is(err, dlock.ErrLeaseLost) {
			return quietErr{leaseLost{err}} // the command may have run partly without the lock
		}
	}
	if code == exitOK {
		return nil
	}
	return quietErr{exitErr{code, fmt.Errorf("%s exited with %d", o.command[0], code)}}
}

// conflictError is the lock not obtained (held, or not within --wait): silent with --quiet.
func (o *runOpts) conflictError(name string, err error) error {
	what := fmt.Sprintf("lock %q is held by another owner", name)
	if o.permits > 0 {
		what = fmt.Sprintf("no permit of semaphore %q is free", name)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		what += fmt.Sprintf(" (waited %v)", o.wait)
	}
	err = notObtained{errors.New(what)}
	if o.quiet {
		return quietErr{err}
	}
	return err
}

// notObtained and leaseLost carry run's messages with the outcome report maps to an exit
// code.
type notObtained struct{ err error }

func (e notObtained) Error() string        { return e.err.Error() }
func (e notObtained) Is(target error) bool { return target == dlock.ErrNotObtained }

type leaseLost struct{ err error }

func (e leaseLost) Error() string        { return e.err.Error() }
func (e leaseLost) Is(target error) bool { return target == dlock.ErrLeaseLost }

// execError is a command that cannot run: 127 if it was not found, 126 if it was found but
// cannot be executed (no permission, a directory, not a binary), as a shell says.
func execError(name string, err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		err = ee.Err // exec.Error repeats the name
	}
	code, hint := exitCannotExec, "check the command's permissions (chmod +x) and that it is a program or a script with #!"
	switch {
	case errors.Is(err, exec.ErrDot):
		hint = "it was found through . in $PATH, which Go refuses: give its path, as ./" + name
	case errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist):
		code, hint = exitNotFound, "check the command's name and $PATH, or give its full path"
	}
	return hinted{exitErr{code, fmt.Errorf("cannot run %q: %w", name, err)}, hint}
}

// defaultAckTimeout is --replica-ack's timeout when it names none.
const defaultAckTimeout = 100 * time.Millisecond

// defaultAOFAckTimeout is --replica-ack-aof's: with appendfsync everysec (Redis's default) an
// fsync comes up to a second after the write.
const defaultAOFAckTimeout = 1500 * time.Millisecond

// parseReplicaAck parses --replica-ack N[/TIMEOUT] ("" is off).
func parseReplicaAck(v string) (int, time.Duration, error) {
	if v == "" {
		return 0, 0, nil
	}
	bad := func(why string) (int, time.Duration, error) {
		return 0, 0, usageError{fmt.Sprintf("--replica-ack %q: %s", v, why), "--replica-ack 1 or --replica-ack 2/250ms"}
	}
	ns, ts, hasTimeout := strings.Cut(v, "/")
	n, err := strconv.Atoi(ns)
	if err != nil || n < 1 {
		return bad("N must be a number of replicas, at least 1")
	}
	d, ok := ackTimeout(ts, hasTimeout, defaultAckTimeout)
	if !ok {
		return bad("TIMEOUT must be a duration of at least 1ms, such as 250ms")
	}
	return n, d, nil
}

// ackTimeout parses an ack flag's TIMEOUT part (def when it has none); ok is false when it
// is not a duration of at least 1ms.
func ackTimeout(ts string, given bool, def time.Duration) (time.Duration, bool) {
	if !given {
		return def, true
	}
	d, err := time.ParseDuration(ts)
	return d, err == nil && d >= time.Millisecond
}

// parseReplicaAckAOF parses --replica-ack-aof [local+]N[/TIMEOUT] or local[/TIMEOUT] ("" is
// off).
func parseReplicaAckAOF(v string) (local bool, n int, d time.Duration, err error) {
	if v == "" {
		return false, 0, 0, nil
	}
	bad := func(why string) (bool, int, time.Duration, error) {
		return false, 0, 0, usageError{fmt.Sprintf("--replica-ack-aof %q: %s", v, why), "--replica-ack-aof 1, --replica-ack-aof local+1/1s or --replica-ack-aof local"}
	}
	spec, ts, hasTimeout := strings.Cut(v, "/")
	if rest, ok := strings.CutPrefix(spec, "local"); ok {
		local, spec = true, strings.TrimPrefix(rest, "+")
		if rest != "" && (!strings.HasPrefix(rest, "+") || spec == "") {
			return bad("write local+N, or local alone")
		}
	}
	if spec != "" || !local {
		if strings.Trim(spec, "0123456789") != "" {
			return bad("N must be a number of replicas, at least 1")
		}
		if n, err = strconv.Atoi(spec); err != nil || n < 1 {
			return bad("N must be a number of replicas, at least 1")
		}
	}
	d, ok := ackTimeout(ts, hasTimeout, defaultAOFAckTimeout)
	if !ok {
		return bad("TIMEOUT must be a duration of at least 1ms, such as 250ms")
	}
	return local, n, d, nil
}

// withoutRunEnv is env less the variables run sets for its command.
func withoutRunEnv(env []string) []string {
	return slices.DeleteFunc(env, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == "DLOCK_NAME" || k == "DLOCK_TOKEN" || k == "DLOCK_TOKENS" || k == "DLOCK_OWNER"
	})
}

// tokensEnv is DLOCK_TOKENS: name=token for every lock the lease holds, comma-separated, in
// the order of names.
func tokensEnv(names []string, l *dlock.Lease) string {
	tokens := l.Tokens()
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + strconv.FormatUint(tokens[n], 10)
	}
	return strings.Join(parts, ",")
}

// A locker is what run takes: a Mutex, an RWMutex to write, or (funcLocker) an RWMutex to
// read or a semaphore's permit.
type locker interface {
	Lock(context.Context) (*dlock.Lease, error)
	TryLock(context.Context) (*dlock.Lease, error)
}

type funcLocker struct {
	lock, tryLock func(context.Context) (*dlock.Lease, error)
}

func (f funcLocker) Lock(ctx context.Context) (*dlock.Lease, error)    { return f.lock(ctx) }
func (f funcLocker) TryLock(ctx context.Context) (*dlock.Lease, error) { return f.tryLock(ctx) }

// stopSelf stops dlock (SIGSTOP) and returns once it is continued. The signal goes to this
// thread: sent to the process, another thread may take it while this one runs on for a
// moment, long enough to continue the command it has just stopped.
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Tgkill(unix.Getpid(), unix.Gettid(), unix.SIGSTOP)
}

// controllingTerminal reports whether dlock has a controlling terminal, whose Ctrl-Z may stop
// it: /dev/tty opens only then.
func controllingTerminal() bool {
	f, err := os.OpenFile("/dev/tty", os.O_RDONLY|unix.O_NOCTTY, 0)
	if err != nil {
		return false
	}
	_ = f.Close()
	return true
}

// foreground reports whether dlock's process group is its terminal's foreground group, which
// the terminal's Ctrl-C, Ctrl-\ and hang-up reach (a background job's signals came from a kill).
func foreground() bool {
	pg, err := unix.IoctlGetInt(int(os.Stdin.Fd()), unix.TIOCGPGRP)
	return err == nil && pg == unix.Getpgrp()
}

// fromTerminal are the signals a terminal sends to its foreground process group, which a
// command run from a terminal shares with dlock: dlock does not pass them on again.
var fromTerminal = map[os.Signal]bool{syscall.SIGINT: true, syscall.SIGQUIT: true, syscall.SIGHUP: true}

// forwarded are the signals dlock passes on to the command (and that end a wait for the lock).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2}

// acquire takes the lock once (once) or waits for it, for at most wait when wait > 0. A
// signal ends the attempt and is returned; a lease already taken is returned with it, for the
// caller to release.
func acquire(m locker, once bool, wait time.Duration, sigs <-chan os.Signal) (*dlock.Lease, os.Signal, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	caught := make(chan os.Signal, 1)
	stopWatch, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case sig := <-sigs:
			caught <- sig
			cancel()
		case <-stopWatch:
		}
	}()
	var l *dlock.Lease
	var err error
	switch {
	case once: // a try can take a while too (Redis slow, a failover): a signal ends it
		l, err = m.TryLock(ctx)
	case wait > 0:
		// One try first, whatever the wait (as flock -w): a wait shorter than a round trip
		// would otherwise end before any attempt reached Redis, and call a free lock held.
		start := time.Now()
		l, err = m.TryLock(ctx)
		retry := errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, dlock.ErrUnavailable) // Lock waits that out
		if left := wait - time.Since(start); retry && ctx.Err() == nil && left > 0 {
			wctx, wcancel := context.WithTimeout(ctx, left)
			l, err = m.Lock(wctx)
			wcancel()
		}
	default:
		l, err = m.Lock(ctx)
	}
	close(stopWatch)
	<-watched // from here on, signals go to the run loop only
	select {
	case sig := <-caught:
		return l, sig, err
	default:
		return l, nil, err
	}
}

// stop ends the command (its process group when target < 0): SIGTERM, then SIGKILL after
// grace, or when end closes if sooner (the lease's end). A group is stopped whole: its leader
// exiting early does not spare a child that ignored SIGTERM, which would otherwise run on
// without the lock.
func stop(target int, exited <-chan error, grace time.Duration, end <-chan struct{}) {
	_ = syscall.Kill(target, syscall.SIGTERM)
	_ = syscall.Kill(target, syscall.SIGCONT) // a command stopped (Ctrl-Z) acts on it only when continued
	deadline := time.After(grace)
	select {
	case <-exited:
	case <-deadline:
		_ = syscall.Kill(target, syscall.SIGKILL)
		<-exited
		return
	case <-end:
		_ = syscall.Kill(target, syscall.SIGKILL)
		<-exited
		return
	}
	if target > 0 {
		return
	}
	// No event tells when the last of a group exits: look every 10ms until the deadline.
	for groupAlive(target) {
		select {
		case <-deadline:
			_ = syscall.Kill(target, syscall.SIGKILL)
			return
		case <-end:
			_ = syscall.Kill(target, syscall.SIGKILL)
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stopBefore is how long before the lease's end the command is told to stop when Redis does
// not renew the lease: --grace, at most an eighth of the TTL. A healthy lease has about half
// its TTL left at its lowest (renewals run every TTL/4, each trusted once the next one
// succeeded), and a renewal that times out (after TTL/4) is retried with more than an eighth
// left, so one slow renewal does not stop the command.
func (o *runOpts) stopBefore() time.Duration { return min(o.grace, o.ttl/8) }

// leaseEnding returns a channel closed once lease, still held, has before or less left of it
// (Redis has not renewed it for a while), looked at every hundredth of before (10 ms at least),
// until done closes. It watches only once the lease has been seen with more than armAbove left
// (half the TTL at least, which run's TTL of a second or more puts above half a second), or a
// second after it began: a lease handed over by a release starts with the grant's TTL, under
// half a second, until its first renewal a quarter of a second later.
func leaseEnding(lease *dlock.Lease, before, armAbove time.Duration, done <-chan struct{}) <-chan struct{} {
	ending := make(chan struct{})
	go func() {
		t := time.NewTicker(max(before/100, 10*time.Millisecond))
		defer t.Stop()
		armed, start := false, time.Now()
		for {
			select {
			case <-done:
				return
			case <-lease.Done():
				return // lost: the caller sees Done
			case <-t.C:
				switch left := lease.Remaining(); {
				case left > armAbove:
					armed = true
				case left > before:
				case armed || time.Since(start) > time.Second:
					close(ending)
					return
				}
			}
		}
	}()
	return ending
}

// exitCode is the command's exit code, 128+signal if a signal ended it.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return exitError
	}
	return exitOK
}
