// Package redisserver starts throwaway redis-server processes: each in its own temp dir,
// listening on a unix socket (no port to collide on) or, on request, a free loopback port.
// StartCluster and StartSentinel build whole topologies from them. Tests use it through
// internal/redistest; the dlock demo uses it when no Redis is given.
package redisserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// InstallHint tells how to get redis-server on Debian.
const InstallHint = "redis-server not found in PATH: install it with `apt-get install -y redis-server` (Debian) or run `bash .ci/run`"

// A Server is one redis-server process (or one redis-sentinel, in a SentinelGroup).
type Server struct {
	dir     string
	args    []string
	env     []string // added to the environment: the clock shim of Config.ClockOffset
	ports   []int    // reserved loopback ports, released by Stop
	Network string   // "unix" or "tcp"
	Addr    string   // socket path or host:port

	mu    sync.Mutex
	p     *proc         // nil while not running
	admin *redis.Client // for the helpers' own commands; see adminClient
}

// proc is one run of the server process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been waited for
}

// Config changes how a Server starts. The zero Config is a unix-socket server with no
// persistence and no memory limit, whose DEBUG command works (enable-debug-command local:
// DEBUG SLEEP, DEBUG POPULATE, ...) and whose replicas sync at once (repl-diskless-sync-delay 0).
type Config struct {
	TCP bool // listen on a free loopback port instead of a unix socket
	// Cluster starts a one-node Redis Cluster owning all 16384 slots (implies TCP), so
	// cluster-mode code paths (ClusterClient, slot routing, hash tags) run for real. For a
	// cluster of several nodes use StartCluster.
	Cluster bool
	// Args are extra redis-server arguments, e.g. "--hz", "100". They come last, so they
	// override what the other fields set.
	Args []string
	// AOF turns on the append-only file with appendfsync always, so every write the server
	// acknowledged before Kill is there again after Restart.
	AOF bool
	// MaxMemory sets maxmemory, e.g. "2mb"; empty keeps Redis's default (no limit).
	MaxMemory string
	// Policy sets maxmemory-policy, e.g. "allkeys-lru"; empty keeps Redis's default
	// (noeviction).
	Policy string
	// ClockOffset shifts the server's wall clock (what TIME shows and what key expiry
	// compares against) by a Go duration with an optional sign: "+2s", "-1500ms". The
	// monotonic clock is left alone. Empty means the real clock. See clock.go for how: a
	// small LD_PRELOAD library built with the system C compiler (libfaketime deadlocks in
	// Debian's jemalloc-linked redis-server).
	ClockOffset string
}

// kind is what a launched process is.
type kind int

const (
	standalone  kind = iota // a plain server
	clusterNode             // cluster-enabled, owning no slots yet
	sentinel                // redis-server --sentinel with a generated config file
)

// Start launches a redis-server and waits until it answers PING. The process dies with the
// calling process (PR_SET_PDEATHSIG), so a crashed test run leaves none behind. A missing
// redis-server is an error carrying InstallHint; a server that does not come up is an error
// carrying the tail of its log.
func Start(cfg Config) (*Server, error) {
	k := standalone
	if cfg.Cluster {
		k = clusterNode
	}
	s, err := launch(cfg, k, "")
	if err != nil {
		return nil, err
	}
	if cfg.Cluster {
		if err := s.claimAllSlots(); err != nil {
			s.Stop()
			return nil, err
		}
	}
	return s, nil
}

// launch starts a server of kind k; for a sentinel, conf is its config file. A TCP port
// another process took between the check and the bind is retried with a new port.
func launch(cfg Config, k kind, conf string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%s", InstallHint)
	}
	env, err := clockEnv(cfg.ClockOffset)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		s, err := launchOnce(bin, env, cfg, k, conf)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == 5 {
			return s, err
		}
	}
}

// errPortTaken marks a start that failed because its port was taken meanwhile.
var errPortTaken = errors.New("port taken")

func launchOnce(bin string, env []string, cfg Config, k kind, conf string) (*Server, error) {
	dir, err := os.MkdirTemp("", "dlock-redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, env: env}
	args := []string{"--dir", dir, "--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log")}
	if k != sentinel {
		args = append(args, "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
			"--enable-debug-command", "local")
	}
	if cfg.TCP || k != standalone {
		port, err := reservePort(k == clusterNode)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		s.ports = []int{port}
		if k == clusterNode {
			s.ports = append(s.ports, port+10000)
		}
		s.Network, s.Addr = "tcp", "127.0.0.1:"+strconv.Itoa(port)
		args = append(args, "--port", strconv.Itoa(port), "--bind", "127.0.0.1")
	} else {
		s.Network, s.Addr = "unix", filepath.Join(dir, "redis.sock")
		args = append(args, "--port", "0", "--unixsocket", s.Addr, "--unixsocketperm", "700")
	}
	switch k {
	case clusterNode:
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"))
	case sentinel:
		path := filepath.Join(dir, "sentinel.conf") // sentinels rewrite their config: a file of their own
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			s.release()
			return nil, err
		}
		args = append([]string{path, "--sentinel"}, args...)
	}
	if cfg.AOF {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	}
	if cfg.MaxMemory != "" {
		args = append(args, "--maxmemory", cfg.MaxMemory)
	}
	if cfg.Policy != "" {
		args = append(args, "--maxmemory-policy", cfg.Policy)
	}
	s.args = append(append([]string{bin}, args...), cfg.Args...)
	if err := s.start(untilPing); err != nil {
		s.release()
		return nil, err
	}
	return s, nil
}

// readiness is what start waits for.
type readiness int

const (
	untilAnswer readiness = iota // any reply, even an error such as LOADING
	untilPing                    // PING succeeds
	untilLoaded                  // PING succeeds and INFO persistence says loading:0
)

// start runs the server process and waits until it is ready.
func (s *Server) start(ready readiness) error {
	s.mu.Lock()
	running := s.p != nil
	s.mu.Unlock()
	if running {
		return fmt.Errorf("redisserver: %s is already running", s.Addr)
	}
	out, err := os.OpenFile(filepath.Join(s.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.Stdout, cmd.Stderr = out, out // what redis prints before it opens its log file
	if len(s.env) > 0 {
		cmd.Env = append(os.Environ(), s.env...)
	}
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisserver: start redis-server: %w", err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()
	if err := s.waitReady(p, ready); err != nil {
		s.Kill()
		return err
	}
	return nil
}

// waitReady polls the starting process until it is ready, has exited, or 10s have passed.
// Each probe dials afresh: a go-redis pool that failed to dial backs off for a second.
func (s *Server) waitReady(p *proc, ready readiness) error {
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-p.done:
			tail := s.LogTail(20)
			if strings.Contains(tail, "Address already in use") {
				return fmt.Errorf("redisserver: %s: %w", s.Addr, errPortTaken)
			}
			return fmt.Errorf("redisserver: redis-server on %s exited at start (%v); log tail:\n%s", s.Addr, p.cmd.ProcessState, tail)
		default:
		}
		ok, err := s.probe(ctx, ready)
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisserver: redis-server on %s not ready within 10s (last reply: %v); log tail:\n%s", s.Addr, err, s.LogTail(20))
		}
		time.Sleep(10 * time.Millisecond) // polling a starting process: no event to wait on
	}
}

// probe checks once whether the server is ready.
func (s *Server) probe(ctx context.Context, ready readiness) (bool, error) {
	conn, err := net.DialTimeout(s.Network, s.Addr, time.Second)
	if err != nil {
		return false, err // not listening yet: no go-redis dial, whose failures it logs
	}
	_ = conn.Close()
	c := redis.NewClient(&redis.Options{Network: s.Network, Addr: s.Addr, MaxRetries: -1, DialerRetries: 1,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, PoolSize: 1})
	defer c.Close()
	err = c.Ping(ctx).Err()
	var reply redis.Error
	switch {
	case ready == untilAnswer && (err == nil || errors.As(err, &reply)):
		return true, nil
	case err != nil || ready == untilPing:
		return err == nil, err
	}
	info, err := c.Info(ctx, "persistence").Result()
	return err == nil && strings.Contains(info, "loading:0"), err
}

// LogTail returns the last n lines of the server's log (and of what it printed before opening
// the log), for error messages.
func (s *Server) LogTail(n int) string {
	var lines []string
	for _, name := range []string{"stdout.log", "redis.log"} {
		b, _ := os.ReadFile(filepath.Join(s.dir, name))
		if t := strings.TrimRight(string(b), "\n"); t != "" {
			lines = append(lines, strings.Split(t, "\n")...)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Options returns go-redis options for this server.
func (s *Server) Options() *redis.Options {
	return &redis.Options{Network: s.Network, Addr: s.Addr, MaxRetries: -1}
}

// URL returns a redis:// or unix:// URL for this server.
func (s *Server) URL() string {
	if s.Network == "unix" {
		return "unix://" + s.Addr
	}
	return "redis://" + s.Addr
}

// Client returns a new go-redis client for this server; the caller closes it.
func (s *Server) Client() *redis.Client { return redis.NewClient(s.Options()) }

// adminClient returns the client the helpers of this package use on the server: kept for
// the server's life, short timeouts so a paused or dead server fails a query in about a second.
func (s *Server) adminClient() *redis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admin == nil {
		o := s.Options()
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolSize = 500*time.Millisecond, time.Second, time.Second, 4
		o.DialerRetries = 1
		s.admin = redis.NewClient(o)
	}
	return s.admin
}

// Running reports whether the server process is running (it may be paused).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p != nil
}

// Kill stops the server with SIGKILL and waits for it to exit. Killing a stopped server does
// nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	p, admin := s.p, s.admin
	s.p, s.admin = nil, nil // a pool that saw the server die backs off dialing: start afresh
	s.mu.Unlock()
	if p != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
	if admin != nil {
		_ = admin.Close()
	}
}

// Restart starts the server again after Kill, with the same address, data dir and
// arguments, and returns once it has finished loading its data (PING succeeds and INFO
// persistence says loading:0). It is an error while the server is running.
func (s *Server) Restart() error { return s.start(untilLoaded) }

// RestartNoWait is Restart that returns as soon as the server answers at all, so a test can
// see the replies (LOADING ...) of a server still loading a large data set.
func (s *Server) RestartNoWait() error { return s.start(untilAnswer) }

// signal sends sig to the server process, if running.
func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		_ = s.p.cmd.Process.Signal(sig)
	}
}

// Pause freezes the server with SIGSTOP.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.Kill()
	s.release()
}

// release frees what the server holds besides its process: directory, ports, admin client.
func (s *Server) release() {
	s.mu.Lock()
	admin := s.admin
	s.admin = nil
	s.mu.Unlock()
	if admin != nil {
		_ = admin.Close()
	}
	_ = os.RemoveAll(s.dir)
	releasePorts(s.ports)
	s.ports = nil
}

// claimAllSlots makes a fresh cluster node own every slot and waits for cluster_state:ok.
func (s *Server) claimAllSlots() error {
	ctx := context.Background()
	c := s.adminClient()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		return fmt.Errorf("redisserver: claim slots: %w", err)
	}
	return poll(10*time.Second, 20*time.Millisecond, func() (bool, string) {
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(info, "cluster_state:ok"), info
	}, "redisserver: one-node cluster not ok")
}

// poll calls check every interval until it reports done or timeout passes; the error then
// says what and carries check's last status. For states of other processes (a cluster
// converging, a replica syncing, a failover) there is no event to wait on.
func poll(timeout, interval time.Duration, check func() (done bool, status string), what string) error {
	deadline := time.Now().Add(timeout)
	for {
		done, status := check()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s after %v: %s", what, timeout, status)
		}
		time.Sleep(interval)
	}
}
