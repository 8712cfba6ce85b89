package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/dlock-go/dlock"
)

// runCommand is `dlock run`: take the lock, run the command while renewing it, release it,
// and exit with the command's code. If the lease is lost the command gets SIGTERM, then
// SIGKILL after --grace, and dlock exits with exitLost.
func runCommand(args []string, stdout, stderr io.Writer) int {
	fs, common := newFlagSet("run", "run [flags] NAME -- COMMAND [ARGS...]\n       run [flags] --lock NAME --lock NAME... -- COMMAND [ARGS...]\n\nSeveral --lock NAMEs are taken together, all or nothing (a multi-lock).", stderr)
	wait := fs.Duration("wait", 0, "give up after waiting this long for the lock (default: wait forever)")
	noWait := fs.Bool("no-wait", false, "fail at once if the lock is held")
	ttl := fs.Duration("ttl", dlock.DefaultTTL, "lease TTL; renewed every TTL/3 while the command runs")
	conflict := fs.Int("conflict-exit-code", exitConflict, "exit code when the lock is not obtained")
	owner := fs.String("owner", "", "owner id (default: random); processes with the same id re-enter the lock")
	grace := fs.Duration("grace", 10*time.Second, "time between SIGTERM and SIGKILL when the lease is lost")
	read := fs.Bool("read", false, "take NAME as a read-write lock, to read: shared with other --read runs")
	write := fs.Bool("write", false, "take NAME as a read-write lock, to write: alone, excluding --read runs")
	permits := fs.Int("permits", 0, "take one permit of NAME as a semaphore of this many: at most that many runs at once")
	replicaAck := fs.String("replica-ack", "", "N[/TIMEOUT]: the lock counts only once N replicas acknowledged it, within TIMEOUT (default "+defaultAckTimeout.String()+")")
	replicaAckAOF := fs.String("replica-ack-aof", "", "[local+]N[/TIMEOUT] or local[/TIMEOUT]: as --replica-ack, but N replicas (and the master, with local) fsynced it to their AOF (WAITAOF, Redis 7.2+); TIMEOUT defaults to "+defaultAOFAckTimeout.String()+" (appendfsync everysec)")
	var locks nameList
	fs.Var(&locks, "lock", "a lock to take (repeat it: the locks are taken together, all or nothing); replaces NAME")
	if err := parse(fs, args); err != nil {
		return report(err, stderr)
	}
	if *read && *write {
		return report(usageError{"--read and --write exclude each other", "dlock run --read config:pricing -- ./serve"}, stderr)
	}
	rest := fs.Args()
	names := []string(locks)
	if len(names) == 0 {
		if len(rest) < 2 {
			return report(usageError{"run needs a lock NAME and a COMMAND", "dlock run nightly-cleanup -- /usr/local/bin/cleanup --all"}, stderr)
		}
		names, rest = rest[:1], rest[1:]
	}
	command := rest
	if len(command) > 0 && command[0] == "--" {
		command = command[1:]
	}
	if len(names) > 1 && (*read || *write) {
		return report(usageError{"--read and --write take one lock, not a multi-lock", "dlock run --read config:pricing -- ./serve"}, stderr)
	}
	if *permits < 0 || (*permits > 0 && (len(names) > 1 || *read || *write)) {
		return report(usageError{"--permits N takes one semaphore NAME (N >= 1), without --read, --write or several --lock", "dlock run --permits 2 exports -- ./export-report"}, stderr)
	}
	name := strings.Join(names, ",")
	if len(command) == 0 {
		return report(usageError{"run needs a COMMAND after NAME --", "dlock run nightly-cleanup -- /usr/local/bin/cleanup --all"}, stderr)
	}
	if *wait < 0 || *grace < 0 {
		return report(usageError{"--wait and --grace must not be negative", ""}, stderr)
	}
	ackN, ackTimeout, err := parseReplicaAck(*replicaAck)
	if err != nil {
		return report(err, stderr)
	}
	aofLocal, aofN, aofTimeout, err := parseReplicaAckAOF(*replicaAckAOF)
	if err != nil {
		return report(err, stderr)
	}
	if *replicaAck != "" && *replicaAckAOF != "" {
		return report(usageError{"--replica-ack and --replica-ack-aof exclude each other", "dlock run --replica-ack-aof local+1/1s NAME -- CMD"}, stderr)
	}

	conn, err := connect(common.redis, false)
	if err != nil {
		return report(err, stderr)
	}
	defer conn.close()
	opts := []dlock.Option{dlock.WithKeyPrefix(common.prefix), dlock.WithTTL(*ttl), dlock.WithoutCohort()}
	if *owner != "" {
		opts = append(opts, dlock.WithOwner(*owner))
	}
	if ackN > 0 {
		opts = append(opts, dlock.WithReplicaAck(ackN, ackTimeout))
	}
	if *replicaAckAOF != "" {
		opts = append(opts, dlock.WithReplicaAckAOF(aofLocal, aofN, aofTimeout))
	}
	dl := conn.client(opts...)
	defer dl.Close(context.Background())
	var m locker = dl.Mutex(name)
	switch {
	case len(names) > 1:
		m = dl.MultiLock(names)
	case *read:
		rw := dl.RWMutex(name)
		m = funcLocker{rw.RLock, rw.TryRLock}
	case *write:
		m = dl.RWMutex(name)
	case *permits > 0:
		sem := dl.Semaphore(name, *permits)
		m = funcLocker{
			func(ctx context.Context) (*dlock.Lease, error) { return sem.Acquire(ctx, 1) },
			func(ctx context.Context) (*dlock.Lease, error) { return sem.TryAcquire(ctx, 1) },
		}
	}

	// Signals while waiting give up the wait; while the command runs they are forwarded.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	lease, sig, err := acquire(m, *noWait, *wait, sigs)
	if sig != nil {
		if lease != nil {
			_ = lease.Unlock(context.Background())
		}
		fmt.Fprintf(stderr, "dlock: error: %v while waiting for lock %q\n", sig, name)
		return 128 + int(sig.(syscall.Signal))
	}
	if err != nil {
		if errors.Is(err, dlock.ErrNotObtained) {
			if *permits > 0 {
				fmt.Fprintf(stderr, "dlock: error: no permit of semaphore %q is free\n", name)
			} else {
				fmt.Fprintf(stderr, "dlock: error: lock %q is held by another owner\n", name)
			}
			return *conflict
		}
		return report(err, stderr)
	}

	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(), "DLOCK_NAME="+name, "DLOCK_TOKENS="+tokensEnv(names, lease),
		"DLOCK_OWNER="+lease.Owner()) // the id `dlock status` shows
	if len(names) == 1 {
		cmd.Env = append(cmd.Env, "DLOCK_TOKEN="+strconv.FormatUint(lease.Token(), 10))
	}
	// The command dies with dlock, whatever kills dlock: it must never outlive the lock.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	group := !isTerminal(os.Stdin)
	if group {
		// Its own process group, so a lost lease stops the command's children too. Not from a
		// terminal: a background group reading it would be stopped (SIGTTIN) while the lock is
		// renewed forever.
		cmd.SysProcAttr.Setpgid = true
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
		return report(hinted{fmt.Errorf("start %q: %w", command[0], err), "check the command's path and permissions"}, stderr)
	}
	target := cmd.Process.Pid
	if group {
		target = -target
	}

	code := exitOK
	for done := false; !done; {
		select {
		case sig := <-sigs:
			_ = syscall.Kill(target, sig.(syscall.Signal))
		case <-lease.Done():
			fmt.Fprintf(stderr, "dlock: error: lease on %q lost (%v); stopping the command\n", name, lease.Err())
			stop(target, exited, *grace)
			return exitLost
		case err := <-exited:
			code = exitCode(err)
			done = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lease.Unlock(ctx); err != nil {
		fmt.Fprintf(stderr, "dlock: error: release %q: %v\n", name, err)
		if code == exitOK && errors.Is(err, dlock.ErrLeaseLost) {
			return exitLost // the command may have run partly without the lock
		}
	}
	return code
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

// names collects a repeated string flag.
type nameList []string

func (n *nameList) String() string     { return strings.Join(*n, ",") }
func (n *nameList) Set(v string) error { *n = append(*n, v); return nil }

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

// forwarded are the signals dlock passes on to the command (and that end a wait for the lock).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2}

// acquire takes the lock once (noWait) or waits for it, for at most wait when wait > 0. A
// signal ends the wait and is returned; a lease already taken is returned with it, for the
// caller to release.
func acquire(m locker, noWait bool, wait time.Duration, sigs <-chan os.Signal) (*dlock.Lease, os.Signal, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if noWait {
		l, err := m.TryLock(ctx)
		return l, nil, err
	}
	if wait > 0 {
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
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
	l, err := m.Lock(ctx)
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
// grace.
func stop(target int, exited <-chan error, grace time.Duration) {
	_ = syscall.Kill(target, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(target, syscall.SIGKILL)
		<-exited
	}
}

// isTerminal reports whether f is a terminal (TCGETS succeeds; /dev/null is not one).
func isTerminal(f *os.File) bool {
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
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
