package redisserver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelConfig changes how StartSentinel builds a group. The zero SentinelConfig is a
// master "mymaster" with 2 replicas watched by 3 sentinels, quorum 2, down after 1s.
type SentinelConfig struct {
	MasterName string // the name the sentinels monitor the master under; "" means "mymaster"
	Replicas   int    // replicas of the master; 0 means 2, negative means none
	Sentinels  int    // sentinels; 0 means 3
	Quorum     int    // sentinels that must agree the master is down; 0 means 2
	// DownAfter is down-after-milliseconds: how long the master must not answer before a
	// sentinel thinks it down; 0 means 1s.
	DownAfter time.Duration
	// FailoverTimeout is failover-timeout: a failover not done by then is aborted, and an
	// automatic one is not retried for twice that; 0 means 3s.
	FailoverTimeout time.Duration
	// ReplicaClockOffset is the Config.ClockOffset of one replica, the first one
	// (Servers()[1]); empty means none.
	ReplicaClockOffset string
	// Server is the Config of the master and the replicas: AOF, MaxMemory, Policy,
	// ClockOffset, Args. TCP is implied; Cluster must be false.
	Server Config
}

// A SentinelGroup is a master, its replicas and the sentinels that watch them, all on
// loopback ports.
type SentinelGroup struct {
	name      string
	servers   []*Server // the initial master, then the replicas
	sentinels []*Server
}

// StartSentinel starts the master, its replicas (replicaof the master) and the sentinels,
// and returns once every replica's link is up and every sentinel knows the master (flags
// "master"), all its replicas and all other sentinels. Sentinels find each other through
// hello messages sent every 2s, so it takes about 2-3s. Errors carry log tails.
func StartSentinel(cfg SentinelConfig) (*SentinelGroup, error) {
	if cfg.Server.Cluster {
		return nil, fmt.Errorf("redisserver: SentinelConfig.Server.Cluster must be false")
	}
	g := &SentinelGroup{name: cfg.MasterName}
	if g.name == "" {
		g.name = "mymaster"
	}
	replicas, sentinels, quorum := cfg.Replicas, cfg.Sentinels, cfg.Quorum
	if replicas == 0 {
		replicas = 2
	} else if replicas < 0 {
		replicas = 0
	}
	if sentinels <= 0 {
		sentinels = 3
	}
	if quorum <= 0 {
		quorum = 2
	}
	downAfter, failoverTimeout := cfg.DownAfter, cfg.FailoverTimeout
	if downAfter <= 0 {
		downAfter = time.Second
	}
	if failoverTimeout <= 0 {
		failoverTimeout = 3 * time.Second
	}
	conf := func(masterPort string) string {
		return fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]s %[3]d\n"+
			"sentinel down-after-milliseconds %[1]s %[4]d\n"+
			"sentinel failover-timeout %[1]s %[5]d\n"+
			"sentinel parallel-syncs %[1]s %[6]d\n",
			g.name, masterPort, quorum, downAfter.Milliseconds(), failoverTimeout.Milliseconds(), max(replicas, 1))
	}
	err := g.start(cfg, replicas, sentinels, conf)
	if err != nil {
		g.Stop()
		return nil, fmt.Errorf("redisserver: start sentinel group: %w", err)
	}
	return g, nil
}

// start launches the servers and sentinels and waits until the group is ready; conf gives
// the sentinels' config file for the master's port.
func (g *SentinelGroup) start(cfg SentinelConfig, replicas, sentinels int, conf func(masterPort string) string) error {
	mcfg := cfg.Server
	mcfg.TCP = true
	master, err := launch(mcfg, standalone, "")
	if err != nil {
		return err
	}
	g.servers = append(g.servers, master)
	host, port, _ := strings.Cut(master.Addr, ":")
	g.servers = append(g.servers, make([]*Server, replicas)...)
	err = parallel(replicas, func(i int) error {
		rcfg := mcfg
		rcfg.Args = append([]string{"--replicaof", host, port}, mcfg.Args...)
		if i == 0 && cfg.ReplicaClockOffset != "" {
			rcfg.ClockOffset = cfg.ReplicaClockOffset
		}
		s, err := launch(rcfg, standalone, "")
		g.servers[1+i] = s
		return err
	})
	if err != nil {
		return err
	}
	ctx := context.Background()
	for _, s := range g.servers[1:] {
		if err := waitLinkUp(s, 10*time.Second); err != nil {
			return err
		}
	}
	g.sentinels = make([]*Server, sentinels)
	err = parallel(sentinels, func(i int) error {
		s, err := launch(Config{TCP: true}, sentinel, conf(port))
		g.sentinels[i] = s
		return err
	})
	if err != nil {
		return err
	}
	for _, s := range g.sentinels {
		var bad string
		err := poll(15*time.Second, 20*time.Millisecond, func() (bool, string) {
			m, err := sentinelMap(s.adminClient().Do(ctx, "SENTINEL", "MASTER", g.name).Result())
			if err != nil {
				return false, err.Error()
			}
			if m["flags"] != "master" || m["num-slaves"] != strconv.Itoa(replicas) || m["num-other-sentinels"] != strconv.Itoa(sentinels-1) {
				return false, fmt.Sprintf("SENTINEL MASTER: flags=%s num-slaves=%s num-other-sentinels=%s", m["flags"], m["num-slaves"], m["num-other-sentinels"])
			}
			rs, err := s.adminClient().Do(ctx, "SENTINEL", "REPLICAS", g.name).Slice()
			if err != nil {
				return false, err.Error()
			}
			for _, r := range rs {
				rm, _ := sentinelMap(r, nil)
				if rm["flags"] != "slave" || rm["master-link-status"] != "ok" {
					bad = rm["name"]
					return false, fmt.Sprintf("replica %s: flags=%s master-link-status=%s", rm["name"], rm["flags"], rm["master-link-status"])
				}
			}
			return true, ""
		}, "sentinel "+s.Addr+" not ready")
		if err != nil {
			if r := g.server(bad); r != nil {
				err = fmt.Errorf("%w\nlog tail of %s:\n%s", err, r.Addr, r.LogTail(10))
			}
			return fmt.Errorf("%w\nlog tail of sentinel %s:\n%s", err, s.Addr, s.LogTail(15))
		}
	}
	return nil
}

// waitLinkUp waits until replica s says master_link_status:up.
func waitLinkUp(s *Server, timeout time.Duration) error {
	err := poll(timeout, 10*time.Millisecond, func() (bool, string) {
		info, err := s.adminClient().Info(context.Background(), "replication").Result()
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(info, "master_link_status:up"), info
	}, "redisserver: replica "+s.Addr+" link not up")
	if err != nil {
		return fmt.Errorf("%w\nlog tail:\n%s", err, s.LogTail(15))
	}
	return nil
}

// parallel runs f(0..n-1) at once and joins the errors.
func parallel(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// sentinelMap turns a SENTINEL MASTER-style reply, a RESP3 map or a RESP2 flat list of
// field and value, into a map.
func sentinelMap(v any, err error) (map[string]string, error) {
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	switch v := v.(type) {
	case map[any]any:
		for k, x := range v {
			m[fmt.Sprint(k)] = fmt.Sprint(x)
		}
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			m[fmt.Sprint(v[i])] = fmt.Sprint(v[i+1])
		}
	default:
		return nil, fmt.Errorf("redisserver: unexpected sentinel reply %T", v)
	}
	return m, nil
}

// MasterName returns the name the sentinels monitor the master under.
func (g *SentinelGroup) MasterName() string { return g.name }

// SentinelAddrs returns the host:port of every sentinel.
func (g *SentinelGroup) SentinelAddrs() []string {
	addrs := make([]string, len(g.sentinels))
	for i, s := range g.sentinels {
		addrs[i] = s.Addr
	}
	return addrs
}

// Sentinels returns the sentinel processes.
func (g *SentinelGroup) Sentinels() []*Server { return append([]*Server(nil), g.sentinels...) }

// Servers returns the data servers: the initial master first, then the replicas. The order
// never changes; which one is master does (see Master).
func (g *SentinelGroup) Servers() []*Server { return append([]*Server(nil), g.servers...) }

// Master returns the current master as the first sentinel that answers reports it
// (SENTINEL GET-MASTER-ADDR-BY-NAME), or nil if none answers.
func (g *SentinelGroup) Master() *Server {
	for _, s := range g.sentinels {
		if addr, err := g.masterAddr(s); err == nil {
			return g.server(addr)
		}
	}
	return nil
}

// masterAddr asks sentinel s for the master's host:port.
func (g *SentinelGroup) masterAddr(s *Server) (string, error) {
	if !s.Running() {
		return "", fmt.Errorf("sentinel %s not running", s.Addr)
	}
	v, err := s.adminClient().Do(context.Background(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", g.name).Slice()
	if err != nil {
		return "", err
	}
	if len(v) != 2 {
		return "", fmt.Errorf("sentinel %s: master %s unknown", s.Addr, g.name)
	}
	return fmt.Sprintf("%v:%v", v[0], v[1]), nil
}

// server returns the data server listening on addr, or nil.
func (g *SentinelGroup) server(addr string) *Server {
	for _, s := range g.servers {
		if s != nil && s.Addr == addr {
			return s
		}
	}
	return nil
}

// FailoverClient returns a new go-redis client that finds the master through the
// sentinels (redis.NewFailoverClient), after applying opts to its options; the caller
// closes it.
func (g *SentinelGroup) FailoverClient(opts ...func(*redis.FailoverOptions)) *redis.Client {
	o := &redis.FailoverOptions{MasterName: g.name, SentinelAddrs: g.SentinelAddrs()}
	for _, f := range opts {
		f(o)
	}
	return redis.NewFailoverClient(o)
}

// Replicas returns the running data servers whose ROLE is slave now, in Servers order.
func (g *SentinelGroup) Replicas() []*Server {
	var out []*Server
	for _, s := range g.servers {
		if !s.Running() {
			continue
		}
		if r, err := s.Role(context.Background()); err == nil && r == "slave" {
			out = append(out, s)
		}
	}
	return out
}

// Failover forces a failover (SENTINEL FAILOVER, retried while the sentinel answers INPROG
// or NOGOODSLAVE) and returns once every running sentinel reports the same new master, that
// server's ROLE is master, the old master, if running, has been turned into its replica with
// its link up (the sentinels do that some seconds later on their own; Failover does it at
// once with REPLICAOF), and the failover has ended on every sentinel, so the group is whole
// again and ready for the next fault. It takes about 2s.
func (g *SentinelGroup) Failover() error {
	ctx := context.Background()
	old := g.Master()
	if old == nil {
		return fmt.Errorf("redisserver: failover: no sentinel reports a master")
	}
	var first *Server
	for _, s := range g.sentinels {
		if s.Running() {
			first = s
			break
		}
	}
	if first == nil {
		return fmt.Errorf("redisserver: failover: no sentinel running")
	}
	err := poll(10*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := first.adminClient().Do(ctx, "SENTINEL", "FAILOVER", g.name).Err()
		if err == nil {
			return true, ""
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "INPROG") && !strings.HasPrefix(msg, "NOGOODSLAVE") {
			return true, msg
		}
		return false, msg
	}, "redisserver: SENTINEL FAILOVER refused")
	if err != nil {
		return err
	}
	now, _, err := g.awaitNewMaster(old, 15*time.Second)
	if err != nil {
		return err
	}
	if !old.Running() {
		return g.waitFailoverEnd(15 * time.Second)
	}
	host, port, _ := strings.Cut(now.Addr, ":")
	if r, err := old.role(ctx); err != nil || r.role != "slave" || r.master != now.Addr {
		if err := old.adminClient().ReplicaOf(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("redisserver: failover: REPLICAOF on the old master %s: %w", old.Addr, err)
		}
	}
	if err := waitLinkUp(old, 10*time.Second); err != nil {
		return err
	}
	return g.waitFailoverEnd(15 * time.Second)
}

// waitFailoverEnd waits until no running sentinel has a failover of the master in progress
// and all of them think it up (SENTINEL MASTER flags are just "master"). A sentinel that led
// a failover keeps reporting the replica it promoted until its failover ends, and the
// failover does not end while that replica is down: killing the new master before then
// leaves that sentinel stuck on it.
func (g *SentinelGroup) waitFailoverEnd(timeout time.Duration) error {
	ctx := context.Background()
	var stuck *Server
	err := poll(timeout, 20*time.Millisecond, func() (bool, string) {
		for _, s := range g.sentinels {
			if !s.Running() {
				continue
			}
			stuck = s
			m, err := sentinelMap(s.adminClient().Do(ctx, "SENTINEL", "MASTER", g.name).Result())
			if err != nil {
				return false, s.Addr + ": " + err.Error()
			}
			if m["flags"] != "master" {
				return false, fmt.Sprintf("sentinel %s: master %s:%s flags %s, failover-state %s", s.Addr, m["ip"], m["port"], m["flags"], m["failover-state"])
			}
		}
		return true, ""
	}, "redisserver: failover not ended")
	if err != nil && stuck != nil {
		err = fmt.Errorf("%w\nlog tail of sentinel %s:\n%s", err, stuck.Addr, stuck.LogTail(20))
	}
	return err
}

// KillMaster kills the current master (Server.Kill) and waits until the sentinels have
// promoted a replica: every running sentinel reports it, its ROLE is master, and the
// failover has ended on every sentinel. It returns the new master and the time its ROLE was
// first seen to be master (roles are polled every 10ms). With the default DownAfter of 1s
// that is about 1.5-3s after the kill, and the sentinels announce it up to a second later.
// Restart the killed server to have the sentinels turn it into a replica.
func (g *SentinelGroup) KillMaster() (*Server, time.Time, error) {
	old := g.Master()
	if old == nil {
		return nil, time.Time{}, fmt.Errorf("redisserver: kill master: no sentinel reports a master")
	}
	old.Kill()
	now, at, err := g.awaitNewMaster(old, 30*time.Second)
	if err == nil {
		err = g.waitFailoverEnd(15 * time.Second)
	}
	return now, at, err
}

// Rejoin restarts old, a server the group failed over from (KillMaster), and makes it a
// replica of the current master at once (the sentinels would, some seconds later); it returns
// once its link is up and no sentinel has a failover in progress, so the group is whole
// again. A server restarted without persistence comes back empty and copies the master.
func (g *SentinelGroup) Rejoin(old *Server) error {
	now := g.Master()
	if now == nil || now == old {
		return fmt.Errorf("redisserver: rejoin %s: no other master reported", old.Addr)
	}
	if !old.Running() {
		if err := old.Restart(); err != nil {
			return err
		}
	}
	host, port, _ := strings.Cut(now.Addr, ":")
	if err := old.adminClient().ReplicaOf(context.Background(), host, port).Err(); err != nil {
		return fmt.Errorf("redisserver: rejoin: REPLICAOF on %s: %w", old.Addr, err)
	}
	if err := waitLinkUp(old, 10*time.Second); err != nil {
		return err
	}
	return g.waitFailoverEnd(15 * time.Second)
}

// ReplicaPrioritySeen reports whether every running sentinel lists replica with
// replica-priority p (a sentinel reads a replica's INFO every 10s, so a CONFIG SET shows up
// there late; until then it would promote by the old value).
func (g *SentinelGroup) ReplicaPrioritySeen(replica *Server, p int) (bool, error) {
	ctx := context.Background()
	for _, s := range g.sentinels {
		if !s.Running() {
			continue
		}
		rs, err := s.adminClient().Do(ctx, "SENTINEL", "REPLICAS", g.name).Slice()
		if err != nil {
			return false, fmt.Errorf("redisserver: SENTINEL REPLICAS on %s: %w", s.Addr, err)
		}
		found := false
		for _, r := range rs {
			m, _ := sentinelMap(r, nil)
			if m["name"] == replica.Addr {
				found = true
				if m["slave-priority"] != strconv.Itoa(p) {
					return false, nil
				}
			}
		}
		if !found {
			return false, nil
		}
	}
	return true, nil
}

// awaitNewMaster waits until every running sentinel reports the same master other than old
// and that server's ROLE is master. The time returned is when that ROLE was first seen: the
// servers' roles are polled every 10ms, as a replica turns master before the sentinels
// announce it.
func (g *SentinelGroup) awaitNewMaster(old *Server, timeout time.Duration) (*Server, time.Time, error) {
	ctx := context.Background()
	promoted := map[*Server]time.Time{}
	var now *Server
	err := poll(timeout, 10*time.Millisecond, func() (bool, string) {
		for _, s := range g.servers {
			if s == old || !s.Running() || !promoted[s].IsZero() {
				continue
			}
			at := time.Now()
			if r, err := s.Role(ctx); err == nil && r == "master" {
				promoted[s] = at
			}
		}
		addr := ""
		for _, s := range g.sentinels {
			if !s.Running() {
				continue
			}
			a, err := g.masterAddr(s)
			if err != nil {
				return false, err.Error()
			}
			if a == old.Addr || (addr != "" && a != addr) {
				return false, fmt.Sprintf("sentinel %s reports master %s", s.Addr, a)
			}
			addr = a
		}
		if now = g.server(addr); now == nil {
			return false, "new master " + addr + " is not a server of this group"
		}
		if promoted[now].IsZero() {
			return false, "new master " + addr + " does not say ROLE master yet"
		}
		return true, ""
	}, "redisserver: failover from "+old.Addr+" not done")
	if err != nil {
		var tail string
		for _, s := range g.sentinels {
			if s.Running() {
				tail = fmt.Sprintf("\nlog tail of sentinel %s:\n%s", s.Addr, s.LogTail(20))
				break
			}
		}
		return nil, time.Time{}, fmt.Errorf("%w%s", err, tail)
	}
	return now, promoted[now], nil
}

// Stop stops the sentinels, then the servers, and removes their directories.
func (g *SentinelGroup) Stop() {
	for _, list := range [][]*Server{g.sentinels, g.servers} {
		_ = parallel(len(list), func(i int) error {
			if list[i] != nil {
				list[i].Stop()
			}
			return nil
		})
	}
}
