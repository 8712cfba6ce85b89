package main

// Replication safety's cost (issue 12): an uncontended acquire with plain dlock, with
// WithReplicaAck(1) on a master with a real replica, and as a Redlock over 3 and 5 masters,
// against redsync over 3 and 5 pools; and Redlock(5) contended against redsync(5). The extra
// servers (4 masters, and a master with its replica) are started by the driver, on loopback,
// the first time a run needs them; the main server is the Redlock's first master.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

const (
	replUncontendedID = "repl-uncontended"
	redlockID         = "redlock-4x8"
	ackTimeout        = time.Second // WithReplicaAck's: a loopback replica answers in well under 1 ms
)

var replLibs = []string{"dlock", "dlock-ack1", "dlock-redlock3", "dlock-redlock5", "redsync", "redsync-3", "redsync-5"}

var redlockLibs = []string{"dlock-redlock5", "redsync-5", "redsync-5-1ms"}

// needsMasters reports whether lib runs on several masters, and needsAck on the replicated pair.
func needsMasters(lib string) bool {
	return strings.HasPrefix(lib, "dlock-redlock") || strings.HasPrefix(lib, "redsync-3") || strings.HasPrefix(lib, "redsync-5")
}
func needsAck(lib string) bool { return lib == "dlock-ack1" }

// newReplLib sets up the libraries of the replication runs, or returns nil for another name.
func newReplLib(name string, e *env) (lib, error) {
	switch name {
	case "dlock-ack1":
		if e.ackRdb == nil {
			return nil, fmt.Errorf("%s: no replicated master", name)
		}
		return &dlockLib{c: dlock.New(e.ackRdb, dlock.WithReplicaAck(1, ackTimeout))}, nil
	case "dlock-redlock3", "dlock-redlock5", "redsync-3", "redsync-5", "redsync-5-1ms":
	default:
		return nil, nil
	}
	n := 3
	if strings.Contains(name, "5") {
		n = 5
	}
	if len(e.masters) < n {
		return nil, fmt.Errorf("%s: %d masters given, %d needed", name, len(e.masters), n)
	}
	ms := e.masters[:n]
	if strings.HasPrefix(name, "dlock") {
		return &dlockLib{c: dlock.NewRedlock(universal(ms))}, nil
	}
	pools := make([]rsredis.Pool, n)
	for i, m := range ms {
		pools[i] = rsgoredis.NewPool(m)
	}
	l := &redsyncLib{rs: redsync.New(pools...)}
	if strings.HasSuffix(name, "-1ms") {
		l.opts = []redsync.Option{redsync.WithRetryDelay(time.Millisecond), redsync.WithTries(1 << 20)}
	}
	return l, nil
}

func universal(cs []*redis.Client) []redis.UniversalClient {
	us := make([]redis.UniversalClient, len(cs))
	for i, c := range cs {
		us[i] = c
	}
	return us
}

// replServers are the extra servers of the replication runs.
type replServers struct {
	masters []*redisserver.Server // 4 more masters (the main server is the first)
	ack     *redisserver.Server   // a master with a replica
	replica *redisserver.Server
}

// replication starts the extra servers on first use and returns the URLs a worker needs.
func (d *driver) replication() (masters []string, ack string, err error) {
	if d.repl == nil {
		r := &replServers{}
		d.repl = r // stopped by close, also when starting fails half-way
		for range 4 {
			s, err := redisserver.Start(redisserver.Config{TCP: true})
			if err != nil {
				return nil, "", err
			}
			r.masters = append(r.masters, s)
		}
		if r.ack, err = redisserver.Start(redisserver.Config{TCP: true}); err != nil {
			return nil, "", err
		}
		host, port, _ := strings.Cut(r.ack.Addr, ":")
		if r.replica, err = redisserver.Start(redisserver.Config{TCP: true, Args: []string{"--replicaof", host, port}}); err != nil {
			return nil, "", err
		}
		if err := r.ack.AwaitReplicated(r.replica, 30*time.Second); err != nil {
			return nil, "", err
		}
	}
	masters = []string{d.redisURL}
	for _, s := range d.repl.masters {
		masters = append(masters, s.URL())
	}
	return masters, d.repl.ack.URL(), nil
}

func (r *replServers) stop() {
	for _, s := range append(append([]*redisserver.Server(nil), r.masters...), r.ack, r.replica) {
		if s != nil {
			s.Stop()
		}
	}
}

// connectRepl opens the worker's clients of the extra servers its library needs.
func connectRepl(ctx context.Context, spec workerSpec, e *env, poolSize int) (closeAll func(), err error) {
	var all []*redis.Client
	closeAll = func() {
		for _, c := range all {
			_ = c.Close()
		}
	}
	for i, u := range spec.Masters {
		if i == 0 { // the main server: the worker's own client
			e.masters = append(e.masters, e.rdb)
			continue
		}
		c, err := newRedis(u, poolSize)
		if err != nil {
			closeAll()
			return nil, err
		}
		all = append(all, c)
		e.masters = append(e.masters, c)
	}
	if spec.AckURL != "" {
		if e.ackRdb, err = newRedis(spec.AckURL, poolSize); err != nil {
			closeAll()
			return nil, err
		}
		all = append(all, e.ackRdb)
	}
	for _, c := range all {
		if err := c.Ping(ctx).Err(); err != nil {
			closeAll()
			return nil, err
		}
	}
	return closeAll, nil
}
