// Package redisserver starts throwaway redis-server processes: each in its own temp dir,
// listening on a unix socket (no port to collide on) or, on request, a free loopback port.
// Tests use it through internal/redistest; the dlock demo uses it when no Redis is given.
package redisserver

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// A Server is one redis-server process.
type Server struct {
	dir     string
	args    []string
	Network string // "unix" or "tcp"
	Addr    string // socket path or host:port

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Config changes how a Server starts.
type Config struct {
	TCP bool // listen on a free loopback port instead of a unix socket
	// Cluster starts a one-node Redis Cluster owning all 16384 slots (implies TCP), so
	// cluster-mode code paths (ClusterClient, slot routing, hash tags) run for real.
	Cluster bool
	Args    []string // extra redis-server arguments, e.g. "--appendonly", "yes"
}

// Start launches a redis-server and waits until it answers PING. The process dies with the
// calling process (PR_SET_PDEATHSIG), so a crashed test run leaves none behind.
func Start(cfg Config) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%s", InstallHint)
	}
	dir, err := os.MkdirTemp("", "dlock-redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir}
	args := []string{"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no",
		"--logfile", filepath.Join(dir, "redis.log")}
	if cfg.TCP || cfg.Cluster {
		port, err := freePort(cfg.Cluster)
		if err != nil {
			return nil, err
		}
		s.Network, s.Addr = "tcp", "127.0.0.1:"+strconv.Itoa(port)
		args = append(args, "--port", strconv.Itoa(port), "--bind", "127.0.0.1")
	} else {
		s.Network, s.Addr = "unix", filepath.Join(dir, "redis.sock")
		args = append(args, "--port", "0", "--unixsocket", s.Addr, "--unixsocketperm", "700")
	}
	if cfg.Cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"))
	}
	s.args = append(append([]string{bin}, args...), cfg.Args...)
	if err := s.start(); err != nil {
		_ = os.RemoveAll(dir)
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

func (s *Server) start() error {
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisserver: start redis-server: %w", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := redis.NewClient(s.Options())
		err := c.Ping(context.Background()).Err()
		_ = c.Close()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redisserver: redis-server did not answer within 10s: %v\n%s", err, log)
		}
		time.Sleep(10 * time.Millisecond) // polling a starting process: no event to wait on
	}
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

// Kill stops the server with SIGKILL and waits for it to exit.
func (s *Server) Kill() {
	s.signal(syscall.SIGKILL)
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Wait()
	}
}

// Restart starts the server again after Kill, with the same address and data dir.
func (s *Server) Restart() error { return s.start() }

// signal sends sig to the server process, if running.
func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Pause freezes the server with SIGSTOP.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.Kill()
	_ = os.RemoveAll(s.dir)
}

// freePort finds a free loopback port; for a cluster node, one whose bus port (+10000) is
// free too.
func freePort(cluster bool) (int, error) {
	if !cluster {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	for try := 0; try < 100; try++ {
		port := 20000 + rand.IntN(30000)
		a, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		a.Close()
		if err != nil {
			continue
		}
		b.Close()
		return port, nil
	}
	return 0, fmt.Errorf("redisserver: no free port pair for a cluster node")
}

// claimAllSlots makes a fresh cluster node own every slot and waits for cluster_state:ok.
func (s *Server) claimAllSlots() error {
	ctx := context.Background()
	c := s.Client()
	defer c.Close()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		return fmt.Errorf("redisserver: claim slots: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisserver: cluster not ok after 10s: %v %s", err, info)
		}
		time.Sleep(20 * time.Millisecond) // polling a starting cluster: no event to wait on
	}
}
