package main

// The consensus-store peers: etcd's concurrency.Mutex ("etcd") and ZooKeeper's lock recipe as
// go-zookeeper implements it, zk.Lock ("zookeeper"). Both are the textbook fair queue: each
// waiter creates an entry ordered by the store (etcd: a key whose create revision orders it;
// ZooKeeper: an ephemeral sequential znode) and watches the deletion of the entry just before
// its own, so a release wakes exactly one waiter. Every lock and unlock is a write through the
// store's replicated, fsynced log (one member here), which is what these services pay for
// their reliability; a crashed holder's lock is freed when its lease or session times out.
//
// Like pg, each runs only when its server is given: ETCD_URL (client URLs, comma-separated)
// and ZK_ADDR (host:port, comma-separated), loopback only. with-consensus.sh starts throwaway
// servers from Debian's etcd-server and zookeeper packages.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// consensusRoot is the parent of every lock: the etcd key prefix or znode is
// consensusRoot + the benchmark's lock name (which starts with the run's prefix).
const consensusRoot = "/dlock-bench/"

// consensusTTL is how long a crashed holder keeps its lock: the etcd session's lease TTL
// (etcd's default is 60 s) and the ZooKeeper session timeout, the same for both.
const consensusTTL = 10 * time.Second

// newConsensusLib returns the etcd or zookeeper lib, or nil, nil for any other name.
func newConsensusLib(name string, e *env) (lib, error) {
	switch name {
	case "etcd":
		if e.etcdURL == "" {
			return nil, errors.New("etcd: ETCD_URL is not set")
		}
		cli, err := etcdClient(e.etcdURL)
		if err != nil {
			return nil, err
		}
		return &etcdLib{cli: cli}, nil
	case "zookeeper":
		if e.zkAddr == "" {
			return nil, errors.New("zookeeper: ZK_ADDR is not set")
		}
		conn, err := zkConnect(e.zkAddr, 0)
		if err != nil {
			return nil, err
		}
		return &zkLib{conn: conn}, nil
	}
	return nil, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// --- etcd: one client per process, one concurrency.Session per goroutine.
//
// The client (one gRPC connection, multiplexed) is shared like the Redis libraries' pools. The
// Session cannot be: a Mutex's key is its name + "/" + the session's lease ID, so two
// goroutines of one session locking the same name would share one key and both believe they
// hold the lock. A session per goroutine is also etcd's model: a session is one lock holder.

func etcdClient(urls string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: splitList(urls), DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return cli, nil
}

type etcdLib struct{ cli *clientv3.Client }

// newLocker grants the goroutine's session lease (its keep-alives run on the client until
// close). The session's context is the client's: the setup context ends before the run.
func (e *etcdLib) newLocker(context.Context) (locker, error) {
	s, err := concurrency.NewSession(e.cli, concurrency.WithTTL(int(consensusTTL/time.Second)))
	if err != nil {
		return nil, fmt.Errorf("etcd: session: %w", err)
	}
	return &etcdLocker{s: s}, nil
}
func (e *etcdLib) close(context.Context) { _ = e.cli.Close() }

type etcdLocker struct {
	s   *concurrency.Session
	key string
	m   *concurrency.Mutex // reused while the key stays the same
}

// lock is Mutex.Lock, which honours ctx: when ctx ends it deletes its key and returns.
func (l *etcdLocker) lock(ctx context.Context, key string) error {
	if l.m == nil || l.key != key {
		l.m, l.key = concurrency.NewMutex(l.s, consensusRoot+key), key
	}
	if err := l.m.Lock(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return nil
}

func (l *etcdLocker) unlock(ctx context.Context) error {
	select {
	case <-l.s.Done(): // the lease expired: the key went with it, the critical section was not protected
		return errors.New("etcd: session lease lost while held")
	default:
	}
	return l.m.Unlock(ctx)
}

// close revokes the session's lease.
func (l *etcdLocker) close() { _ = l.s.Close() }

// --- zookeeper: one connection (one session) per process, one zk.Lock per goroutine and key.
//
// As with Curator and other ZooKeeper clients, the process shares one session: a zk.Lock's
// identity is its own ephemeral sequential znode (GUID-protected name), not the session, so
// goroutines of one session exclude each other. A session per goroutine would only add
// connections and session keep-alives (and meet the server's 60 connections per address
// default at 256 waiters); in 1 s smoke runs of the contended shapes it was no faster beyond
// run-to-run noise (both are bound by the server's fsync per write).

// zkConnect opens a session and waits until it is established. bufSize > 0 raises the
// client's limit on a reply's size (1.5 MB by default).
func zkConnect(addrs string, bufSize int) (*zk.Conn, error) {
	var conn *zk.Conn
	var err error
	if bufSize > 0 {
		conn, _, err = zk.Connect(splitList(addrs), consensusTTL, zk.WithLogInfo(false),
			zk.WithMaxBufferSize(bufSize), zk.WithMaxConnBufferSize(bufSize))
	} else {
		conn, _, err = zk.Connect(splitList(addrs), consensusTTL, zk.WithLogInfo(false))
	}
	if err != nil {
		return nil, fmt.Errorf("zookeeper: %w", err)
	}
	for deadline := time.Now().Add(10 * time.Second); conn.State() != zk.StateHasSession; {
		if time.Now().After(deadline) {
			conn.Close()
			return nil, fmt.Errorf("zookeeper: no session with %s after 10s (state %v)", addrs, conn.State())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return conn, nil
}

type zkLib struct{ conn *zk.Conn }

func (z *zkLib) newLocker(context.Context) (locker, error) { return &zkLocker{conn: z.conn}, nil }

// close ends the session: ZooKeeper deletes its ephemeral znodes.
func (z *zkLib) close(context.Context) { z.conn.Close() }

type zkLocker struct {
	conn *zk.Conn
	key  string
	lk   *zk.Lock // reused while the key stays the same
}

// lock runs zk.Lock, which takes no context, in a goroutine and stops waiting for it when ctx
// ends. The abandoned call keeps its place in the queue and releases the lock as soon as it
// gets it (which happens after the run's end, when the loops no longer lock).
func (l *zkLocker) lock(ctx context.Context, key string) error {
	if l.lk == nil || l.key != key {
		l.lk, l.key = zk.NewLock(l.conn, consensusRoot+key, zk.WorldACL(zk.PermAll)), key
	}
	lk := l.lk
	done := make(chan error, 1)
	go func() { done <- lk.Lock() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		l.lk = nil // still in use by the abandoned call
		go func() {
			if <-done == nil {
				_ = lk.Unlock()
			}
		}()
		return ctx.Err()
	}
}

// unlock deletes the lock's znode; it is already gone (ErrNoNode) if the session expired
// while held, which counts as an error: the critical section was not protected.
func (l *zkLocker) unlock(context.Context) error {
	if err := l.lk.Unlock(); err != nil {
		return fmt.Errorf("zookeeper: unlock: %w", err)
	}
	return nil
}

func (l *zkLocker) close() {}

// --- driver side: checks, versions, clean-up

// checkEtcd refuses a non-loopback ETCD_URL and returns the server's version.
func checkEtcd(ctx context.Context, urls string) (string, error) {
	eps := splitList(urls)
	if len(eps) == 0 {
		return "", errors.New("ETCD_URL: no endpoint")
	}
	for _, ep := range eps {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("ETCD_URL: %q is not a URL like http://127.0.0.1:2379", ep)
		}
		if err := checkLoopback("ETCD_URL", "", u.Host); err != nil {
			return "", err
		}
	}
	cli, err := etcdClient(urls)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	st, err := cli.Status(ctx, eps[0])
	if err != nil {
		return "", fmt.Errorf("ETCD_URL: %w (bench/with-consensus.sh starts a throwaway etcd)", err)
	}
	return st.Version, nil
}

// checkZK refuses a non-loopback ZK_ADDR and returns the server's version (from the "srvr"
// four-letter command, allowed by default; "" if it is not).
func checkZK(addrs string) (string, error) {
	as := splitList(addrs)
	if len(as) == 0 {
		return "", errors.New("ZK_ADDR: no address")
	}
	for _, a := range as {
		if err := checkLoopback("ZK_ADDR", "", a); err != nil {
			return "", err
		}
	}
	conn, err := zkConnect(addrs, 0)
	if err != nil {
		return "", fmt.Errorf("ZK_ADDR: %w (bench/with-consensus.sh starts a throwaway ZooKeeper)", err)
	}
	conn.Close()
	return zkVersion(as[0]), nil
}

// zkVersion reads "Zookeeper version: 3.8.0-…, built on …" from srvr.
func zkVersion(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return ""
	}
	line, _ := bufio.NewReader(c).ReadString('\n')
	v, ok := strings.CutPrefix(line, "Zookeeper version: ")
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, ",")
	v, _, _ = strings.Cut(v, "-") // Debian's build leaves "-${mvngit.commit.id}"
	return v
}

// cleanupConsensus removes what a run left in etcd or ZooKeeper. The locks' own entries are
// deleted by unlock and with their session, but zk.Lock leaves each lock's parent znode (one
// per fresh name in the uncontended run), and a killed worker's entries outlive it until its
// session times out.
func (d *driver) cleanupConsensus(lib, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch lib {
	case "etcd":
		cli, err := etcdClient(d.etcdURL)
		if err != nil {
			return
		}
		defer cli.Close()
		_, _ = cli.Delete(ctx, consensusRoot+prefix, clientv3.WithPrefix())
	case "zookeeper":
		// A fresh-name run leaves one child per acquisition: allow a large getChildren reply.
		conn, err := zkConnect(d.zkAddr, 64<<20)
		if err != nil {
			return
		}
		defer conn.Close()
		root := strings.TrimSuffix(consensusRoot, "/")
		names, _, err := conn.Children(root)
		if err != nil {
			return
		}
		var ops []any
		flush := func() {
			if len(ops) == 0 {
				return
			}
			if _, err := conn.Multi(ops...); err != nil { // all or nothing: one by one then
				for _, op := range ops {
					_ = conn.Delete(op.(*zk.DeleteRequest).Path, -1)
				}
			}
			ops = ops[:0]
		}
		for _, n := range names {
			if strings.HasPrefix(n, prefix) {
				ops = append(ops, &zk.DeleteRequest{Path: root + "/" + n, Version: -1})
				if len(ops) == 1000 {
					flush()
				}
			}
		}
		flush()
	}
}
