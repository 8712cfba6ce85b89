package redisserver

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterConfig changes how StartCluster builds a cluster. The zero ClusterConfig is 3
// masters with 1 replica each and a 1s cluster-node-timeout.
type ClusterConfig struct {
	Masters  int // number of masters; 0 means 3
	Replicas int // replicas per master; 0 means 1, negative means none
	// NodeTimeout is cluster-node-timeout; 0 means 1s. A killed master's replica takes over
	// about NodeTimeout+1-1.5s after the kill (see Cluster.AwaitPromotion).
	NodeTimeout time.Duration
	// ReplicaClockOffset is the Config.ClockOffset of one replica, the first one
	// (Nodes()[Masters], a replica of the first master); empty means none.
	ReplicaClockOffset string
	// Node is the Config of every node: AOF, MaxMemory, Policy, ClockOffset, Args (which
	// override the cluster's own settings). TCP and Cluster are implied.
	Node Config
}

// A Cluster is a Redis Cluster of redis-server processes on loopback ports. Its nodes keep
// their order (Nodes) for its life; which of them are masters changes with failovers.
type Cluster struct {
	nodes   []*Server // masters first, then replica j of master i at masters + i*replicas + j
	ids     []string  // cluster node IDs, as nodes
	masters int
}

// StartCluster starts the nodes, joins them (CLUSTER MEET), splits the 16384 slots evenly
// over the masters, attaches the replicas (CLUSTER REPLICATE) and returns once every node
// says cluster_state:ok, every replica's master_link_status is up and all nodes agree on
// the slot map. Replicas take over a failed master on their own
// (cluster-replica-no-failover no, cluster-replica-validity-factor 0). It takes a little
// over 2s: a master that starts says cluster_state:ok no sooner than 2s after its start
// (Redis's CLUSTER_WRITABLE_DELAY). Errors carry the log tails of the nodes concerned.
func StartCluster(cfg ClusterConfig) (*Cluster, error) {
	masters, replicas, timeout := cfg.Masters, cfg.Replicas, cfg.NodeTimeout
	if masters <= 0 {
		masters = 3
	}
	if replicas == 0 {
		replicas = 1
	} else if replicas < 0 {
		replicas = 0
	}
	if timeout <= 0 {
		timeout = time.Second
	}
	c := &Cluster{masters: masters, nodes: make([]*Server, masters*(1+replicas)), ids: make([]string, masters*(1+replicas))}
	err := c.eachNode(func(i int, _ *Server) error {
		ncfg := cfg.Node
		ncfg.TCP, ncfg.Cluster = true, false
		ncfg.Args = append([]string{"--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
			"--cluster-replica-no-failover", "no", "--cluster-replica-validity-factor", "0"}, cfg.Node.Args...)
		if i == masters && cfg.ReplicaClockOffset != "" {
			ncfg.ClockOffset = cfg.ReplicaClockOffset
		}
		s, err := launch(ncfg, clusterNode, "")
		if err != nil {
			return err
		}
		c.nodes[i] = s
		return nil
	})
	if err == nil {
		err = c.join(replicas)
	}
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("redisserver: start cluster: %w", err)
	}
	return c, nil
}

// eachNode runs f on every node index in parallel and joins the errors.
func (c *Cluster) eachNode(f func(i int, s *Server) error) error {
	return parallel(len(c.nodes), func(i int) error { return f(i, c.nodes[i]) })
}

// join makes the started nodes one cluster and waits until it is ready.
func (c *Cluster) join(replicas int) error {
	ctx := context.Background()
	err := c.eachNode(func(i int, s *Server) error {
		a := s.adminClient()
		id, err := a.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER MYID: %w", s.Addr, err)
		}
		c.ids[i] = id
		// Distinct epochs up front spare the cluster resolving epoch collisions.
		if err := a.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER SET-CONFIG-EPOCH: %w", s.Addr, err)
		}
		if i < c.masters {
			lo, hi := i*16384/c.masters, (i+1)*16384/c.masters-1
			if err := a.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
				return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE %d %d: %w", s.Addr, lo, hi, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	first := c.nodes[0].adminClient()
	for _, s := range c.nodes[1:] {
		host, port, _ := strings.Cut(s.Addr, ":")
		if err := first.ClusterMeet(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET %s: %w", s.Addr, err)
		}
	}
	// A replica can only replicate a master it knows.
	err = c.eachNode(func(i int, s *Server) error {
		if i < c.masters {
			return nil
		}
		master := c.ids[(i-c.masters)/replicas]
		err := poll(10*time.Second, 20*time.Millisecond, func() (bool, string) {
			nodes, err := s.adminClient().ClusterNodes(ctx).Result()
			if err != nil {
				return false, err.Error()
			}
			for _, n := range parseClusterNodes(nodes) {
				if n.id == master && !n.flags["handshake"] && !n.flags["noaddr"] {
					return true, ""
				}
			}
			return false, "master not known yet:\n" + nodes
		}, s.Addr+": master not known")
		if err != nil {
			return err
		}
		if err := s.adminClient().Do(ctx, "CLUSTER", "REPLICATE", master).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER REPLICATE: %w", s.Addr, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return c.WaitStable(15 * time.Second)
}

// WaitStable waits until every running node says cluster_state:ok and knows every node,
// every running replica's link to its master is up, and all running nodes agree on the
// slot map and on who replicates whom. StartCluster and GracefulFailover end with it; call
// it after KillMaster or a Restart to let the cluster settle before the next fault.
func (c *Cluster) WaitStable(timeout time.Duration) error {
	ctx := context.Background()
	var bad *Server
	err := poll(timeout, 20*time.Millisecond, func() (bool, string) {
		views := map[string][]string{}
		for _, s := range c.nodes {
			if !s.Running() {
				continue
			}
			bad = s
			a := s.adminClient()
			info, err := a.ClusterInfo(ctx).Result()
			if err != nil {
				return false, s.Addr + ": " + err.Error()
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.nodes))+"\r\n") {
				return false, s.Addr + ": CLUSTER INFO:\n" + info
			}
			r, err := s.role(ctx)
			if err != nil {
				return false, s.Addr + ": ROLE: " + err.Error()
			}
			if r.role == "slave" {
				repl, err := a.Info(ctx, "replication").Result()
				if err != nil {
					return false, s.Addr + ": " + err.Error()
				}
				if !strings.Contains(repl, "master_link_status:up") {
					return false, s.Addr + ": INFO replication:\n" + repl
				}
			}
			nodes, err := a.ClusterNodes(ctx).Result()
			if err != nil {
				return false, s.Addr + ": " + err.Error()
			}
			view := slotMap(parseClusterNodes(nodes))
			views[view] = append(views[view], s.Addr)
		}
		if len(views) > 1 {
			bad = nil
			var b strings.Builder
			for v, who := range views {
				fmt.Fprintf(&b, "seen by %v:\n%s\n", who, v)
			}
			return false, "nodes disagree on the slot map:\n" + b.String()
		}
		return true, ""
	}, "cluster not stable")
	if err != nil && bad != nil {
		err = fmt.Errorf("%w\nlog tail of %s:\n%s", err, bad.Addr, bad.LogTail(15))
	}
	return err
}

// clusterNodeLine is one line of CLUSTER NODES.
type clusterNodeLine struct {
	id, addr, master string // addr is host:port; master is "-" for a master
	flags            map[string]bool
	epoch            int64
	slots            [][2]int // owned slot ranges, inclusive
}

// parseClusterNodes parses a CLUSTER NODES reply.
func parseClusterNodes(text string) []clusterNodeLine {
	var out []clusterNodeLine
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := clusterNodeLine{id: f[0], master: f[3], flags: map[string]bool{}}
		n.addr, _, _ = strings.Cut(f[1], "@")
		for _, fl := range strings.Split(f[2], ",") {
			n.flags[fl] = true
		}
		n.epoch, _ = strconv.ParseInt(f[6], 10, 64)
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated or imported
				continue
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 == nil && err2 == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		out = append(out, n)
	}
	return out
}

// slotMap renders what a node believes about slot ownership and replication, comparable
// across nodes: one line per node, "id master <slots>" or "id replicates <master id>".
func slotMap(nodes []clusterNodeLine) string {
	var lines []string
	for _, n := range nodes {
		if n.flags["slave"] {
			lines = append(lines, n.id+" replicates "+n.master)
			continue
		}
		line := n.id + " master"
		for _, r := range n.slots {
			line += fmt.Sprintf(" %d-%d", r[0], r[1])
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// Addrs returns the host:port of every node, in Nodes order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr
	}
	return addrs
}

// Nodes returns every node: the initial masters first (in slot order), then the replicas,
// replica j of initial master i at index Masters+i*Replicas+j. The order never changes.
func (c *Cluster) Nodes() []*Server { return append([]*Server(nil), c.nodes...) }

// Masters returns the running nodes whose ROLE is master now, in Nodes order.
func (c *Cluster) Masters() []*Server { return c.withRole("master") }

// Replicas returns the running nodes whose ROLE is slave now, in Nodes order.
func (c *Cluster) Replicas() []*Server { return c.withRole("slave") }

func (c *Cluster) withRole(role string) []*Server {
	var out []*Server
	for _, s := range c.nodes {
		if !s.Running() {
			continue
		}
		if r, err := s.Role(context.Background()); err == nil && r == role {
			out = append(out, s)
		}
	}
	return out
}

// MasterForSlot returns the running node that serves slot now: of the nodes that say, of
// themselves, that they are a master owning it, the one with the highest config epoch. It
// returns nil when none does (say, its master was killed and no replica has taken over yet).
func (c *Cluster) MasterForSlot(slot int) *Server {
	var best *Server
	var bestEpoch int64 = -1
	for _, s := range c.nodes {
		if !s.Running() {
			continue
		}
		nodes, err := s.adminClient().ClusterNodes(context.Background()).Result()
		if err != nil {
			continue
		}
		for _, n := range parseClusterNodes(nodes) {
			if !n.flags["myself"] || !n.flags["master"] {
				continue
			}
			for _, r := range n.slots {
				if r[0] <= slot && slot <= r[1] && n.epoch > bestEpoch {
					best, bestEpoch = s, n.epoch
				}
			}
		}
	}
	return best
}

// ReplicaOf returns a running node whose ROLE says it replicates master now, or nil.
func (c *Cluster) ReplicaOf(master *Server) *Server {
	for _, s := range c.nodes {
		if s == master || !s.Running() {
			continue
		}
		if r, err := s.role(context.Background()); err == nil && r.role == "slave" && r.master == master.Addr {
			return s
		}
	}
	return nil
}

// Client returns a new go-redis ClusterClient seeded with every node's address, after
// applying opts to its options; the caller closes it.
func (c *Cluster) Client(opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, f := range opts {
		f(o)
	}
	return redis.NewClusterClient(o)
}

// GracefulFailover runs CLUSTER FAILOVER on replica (the replica first catches up with its
// master, so no acknowledged write is lost) and returns once the replica's ROLE is master,
// the old master's ROLE is slave of it with its link up, and the running nodes agree on the
// slot map again. It takes well under a second.
func (c *Cluster) GracefulFailover(replica *Server) error {
	ctx := context.Background()
	r, err := replica.role(ctx)
	if err != nil {
		return fmt.Errorf("redisserver: failover: ROLE of %s: %w", replica.Addr, err)
	}
	if r.role != "slave" {
		return fmt.Errorf("redisserver: failover: %s is a %s, not a replica", replica.Addr, r.role)
	}
	old := c.node(r.master)
	if old == nil {
		return fmt.Errorf("redisserver: failover: %s replicates %s, not a node of this cluster", replica.Addr, r.master)
	}
	if err := replica.adminClient().Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		return fmt.Errorf("redisserver: CLUSTER FAILOVER on %s: %w", replica.Addr, err)
	}
	err = poll(10*time.Second, 10*time.Millisecond, func() (bool, string) {
		nr, err := replica.role(ctx)
		if err != nil || nr.role != "master" {
			return false, fmt.Sprintf("%s: role %q %v", replica.Addr, nr.role, err)
		}
		or, err := old.role(ctx)
		if err != nil || or.role != "slave" || or.master != replica.Addr || or.state != "connected" {
			return false, fmt.Sprintf("old master %s: %+v %v", old.Addr, or, err)
		}
		return true, ""
	}, "redisserver: failover to "+replica.Addr+" not done")
	if err != nil {
		return fmt.Errorf("%w\nlog tail of %s:\n%s", err, replica.Addr, replica.LogTail(15))
	}
	return c.WaitStable(10 * time.Second)
}

// AwaitPromotion waits until replica's ROLE is master, polling every 5ms, and returns the
// time the ROLE request that first saw it was sent: the promotion happened at most one poll
// before. Use it after killing replica's master (Server.Kill): with the default NodeTimeout
// of 1s the replica takes over about 2-2.5s after the kill (the master is suspected after
// NodeTimeout, failed once a majority of masters agree, then the replica waits 0.5-1s
// before its election).
func (c *Cluster) AwaitPromotion(replica *Server, timeout time.Duration) (time.Time, error) {
	ctx := context.Background()
	var at time.Time
	err := poll(timeout, 5*time.Millisecond, func() (bool, string) {
		at = time.Now()
		r, err := replica.role(ctx)
		if err != nil {
			return false, err.Error()
		}
		return r.role == "master", "role " + r.role
	}, "redisserver: "+replica.Addr+" not promoted")
	if err != nil {
		return time.Time{}, fmt.Errorf("%w\nlog tail of %s:\n%s", err, replica.Addr, replica.LogTail(15))
	}
	return at, nil
}

// KillMaster kills master (Server.Kill), waits until its replica takes over
// (AwaitPromotion, up to 15s) and returns that replica and the time its promotion was first
// seen. It returns at once then: the other nodes may learn of the promotion a moment later
// (WaitStable waits for that). Restart the killed node to have it rejoin as a replica.
func (c *Cluster) KillMaster(master *Server) (*Server, time.Time, error) {
	replica := c.ReplicaOf(master)
	if replica == nil {
		return nil, time.Time{}, fmt.Errorf("redisserver: %s has no replica to take over", master.Addr)
	}
	master.Kill()
	at, err := c.AwaitPromotion(replica, 15*time.Second)
	return replica, at, err
}

// node returns the node listening on addr, or nil.
func (c *Cluster) node(addr string) *Server {
	for _, s := range c.nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// Stop stops every node and removes their directories.
func (c *Cluster) Stop() {
	_ = c.eachNode(func(_ int, s *Server) error {
		if s != nil {
			s.Stop()
		}
		return nil
	})
}
