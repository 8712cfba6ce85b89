package main

// Library adapters. A lib is set up once per worker process (one client, one connection pool);
// each goroutine gets its own locker from it and calls lock(ctx, key) then unlock(ctx).
// lock waits until the lock is held or ctx ends (then it returns an error); libraries that give
// up on their own (redsync's ErrFailed, redislock's ErrNotObtained) are called again, and the
// wait counts from the first call.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

// libNames lists every library in report order. pg, etcd and zookeeper run only when their
// server is given (optionalEnv).
var libNames = []string{
	"dlock", "dlock-nocohort", "dlock-rueidis", "redsync", "redsync-1ms", "redsync-10ms", "redsync-100ms",
	"redislock-100ms", "redislock-10ms", "redislock-1ms", "rueidislock", "pg", "etcd", "zookeeper", "raw",
}

// optionalEnv names the environment variable that gives an optional peer its server, or ""
// for the libraries that always run (on the bench's own Redis).
func optionalEnv(lib string) string {
	switch {
	case strings.HasPrefix(lib, "pg"):
		return "PG_URL"
	case lib == "etcd":
		return "ETCD_URL"
	case lib == "zookeeper":
		return "ZK_ADDR"
	}
	return ""
}

// usesRedisLock reports whether the library locks in Redis (pg, etcd and zookeeper do not:
// the Redis columns count only their critical sections).
func usesRedisLock(lib string) bool { return optionalEnv(lib) == "" }

// isPeer reports whether name is a library dlock is compared against (not dlock itself, not
// the unsafe raw floor).
func isPeer(name string) bool {
	return name != "raw" && !strings.HasPrefix(name, "dlock")
}

// isSafe reports whether the library is meant to give mutual exclusion (raw is not).
func isSafe(name string) bool { return name != "raw" }

// holdTTL is the lease length for libraries that take one (redislock, raw).
const holdTTL = 30 * time.Second

// env is what a worker process shares among its goroutines.
type env struct {
	redisURL string
	rdb      *redis.Client // the process's go-redis client (also used for critical sections)
	pgURL    string
	etcdURL  string
	zkAddr   string
	masters  []*redis.Client // replication runs: independent masters, the main server first
	ackRdb   *redis.Client   // replication runs: a master with a replica
}

// lib is one library set up in one process.
type lib interface {
	newLocker(ctx context.Context) (locker, error)
	close(ctx context.Context)
}

// locker is one goroutine's handle. It is used by one goroutine only.
type locker interface {
	lock(ctx context.Context, key string) error
	unlock(ctx context.Context) error
	close()
}

func newLib(name string, e *env) (lib, error) {
	if l := newSemLib(name, e); l != nil {
		return l, nil
	}
	if l, err := newReplLib(name, e); l != nil || err != nil {
		return l, err
	}
	if l, err := newConsensusLib(name, e); l != nil || err != nil {
		return l, err
	}
	switch name {
	case "dlock":
		return &dlockLib{c: dlock.New(e.rdb)}, nil
	case "dlock-nocohort":
		return &dlockLib{c: dlock.New(e.rdb, dlock.WithoutCohort())}, nil
	case "dlock-rueidis": // dlock with its scripts on rueidis (the dlockrueidis adapter)
		rc, err := dlockrueidis.ClientFor(e.rdb)
		if err != nil {
			return nil, err
		}
		return &dlockLib{c: dlockrueidis.New(e.rdb, rc), rc: rc}, nil
	case "redsync":
		return &redsyncLib{rs: redsync.New(rsgoredis.NewPool(e.rdb))}, nil
	case "redsync-1ms", "redsync-10ms", "redsync-100ms":
		return &redsyncLib{rs: redsync.New(rsgoredis.NewPool(e.rdb)),
			opts: []redsync.Option{redsync.WithRetryDelay(retryDelay(name)), redsync.WithTries(1 << 20)}}, nil
	case "redislock-1ms", "redislock-10ms", "redislock-100ms":
		return &redislockLib{c: redislock.New(e.rdb), backoff: retryDelay(name)}, nil
	case "rueidislock":
		opt, err := rueidis.ParseURL(e.redisURL)
		if err != nil {
			return nil, fmt.Errorf("rueidislock: %w", err)
		}
		l, err := rueidislock.NewLocker(rueidislock.LockerOption{ClientOption: opt, KeyMajority: 1})
		if err != nil {
			return nil, fmt.Errorf("rueidislock: %w", err)
		}
		return &rueidisLib{l: l}, nil
	case "raw":
		return &rawLib{rdb: e.rdb}, nil
	case "pg":
		if e.pgURL == "" {
			return nil, errors.New("pg: PG_URL is not set")
		}
		return &pgLib{url: e.pgURL}, nil
	}
	return nil, fmt.Errorf("unknown library %q", name)
}

// retryDelay is the retry delay a peer's name ends with ("-1ms", "-10ms", "-100ms"): each
// polling peer runs at the three, so a comparison takes its best setting.
func retryDelay(name string) time.Duration {
	d, err := time.ParseDuration(name[strings.LastIndexByte(name, '-')+1:])
	if err != nil {
		panic("bench: no retry delay in library name " + name)
	}
	return d
}

// retryPause keeps a goroutine whose lock call failed with a real error from spinning.
func retryPause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// --- dlock: one Client per process, one Mutex handle per goroutine and key (reused).

type dlockLib struct {
	c  *dlock.Client
	rc rueidis.Client // dlock-rueidis: the client its scripts run on
}

func (d *dlockLib) newLocker(context.Context) (locker, error) { return &dlockLocker{c: d.c}, nil }

func (d *dlockLib) close(ctx context.Context) {
	_ = d.c.Close(ctx)
	if d.rc != nil {
		d.rc.Close()
	}
}

type dlockLocker struct {
	c   *dlock.Client
	key string
	m   *dlock.Mutex
	l   *dlock.Lease
}

func (d *dlockLocker) lock(ctx context.Context, key string) error {
	if d.m == nil || d.key != key {
		d.m, d.key = d.c.Mutex(key), key
	}
	l, err := d.m.Lock(ctx)
	if err != nil {
		return err
	}
	d.l = l
	return nil
}

func (d *dlockLocker) unlock(ctx context.Context) error {
	l := d.l
	d.l = nil
	if err := l.Err(); err != nil { // lost while held: the critical section was not protected
		_ = l.Unlock(ctx)
		return fmt.Errorf("lease lost while held: %w", err)
	}
	return l.Unlock(ctx)
}

func (d *dlockLocker) close() {}

// --- redsync: one Redsync per process, one Mutex per goroutine and key (reused).

type redsyncLib struct {
	rs   *redsync.Redsync
	opts []redsync.Option
}

func (r *redsyncLib) newLocker(context.Context) (locker, error) { return &redsyncLocker{lib: r}, nil }
func (r *redsyncLib) close(context.Context)                     {}

type redsyncLocker struct {
	lib *redsyncLib
	key string
	m   *redsync.Mutex
}

func (r *redsyncLocker) lock(ctx context.Context, key string) error {
	if r.m == nil || r.key != key {
		r.m, r.key = r.lib.rs.NewMutex(key, r.lib.opts...), key
	}
	for {
		err := r.m.LockContext(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var taken *redsync.ErrTaken
		var nodeTaken *redsync.ErrNodeTaken
		if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) || errors.As(err, &nodeTaken) {
			continue // gave up after its tries: call again, the wait goes on
		}
		return err
	}
}

func (r *redsyncLocker) unlock(ctx context.Context) error {
	ok, err := r.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock refused")
	}
	return err
}

func (r *redsyncLocker) close() {}

// --- bsm/redislock: Obtain with a linear backoff, called again until acquired.

type redislockLib struct {
	c       *redislock.Client
	backoff time.Duration
}

func (r *redislockLib) newLocker(context.Context) (locker, error) {
	return &redislockLocker{lib: r}, nil
}
func (r *redislockLib) close(context.Context) {}

type redislockLocker struct {
	lib *redislockLib
	l   *redislock.Lock
}

func (r *redislockLocker) lock(ctx context.Context, key string) error {
	for {
		l, err := r.lib.c.Obtain(ctx, key, holdTTL, &redislock.Options{RetryStrategy: redislock.LinearBackoff(r.lib.backoff)})
		if err == nil {
			r.l = l
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, redislock.ErrNotObtained) {
			return err
		}
	}
}

func (r *redislockLocker) unlock(ctx context.Context) error {
	l := r.l
	r.l = nil
	return l.Release(ctx)
}

func (r *redislockLocker) close() {}

// --- rueidislock with KeyMajority 1: one Locker per process; cancel() releases.

type rueidisLib struct{ l rueidislock.Locker }

func (r *rueidisLib) newLocker(context.Context) (locker, error) { return &rueidisLocker{l: r.l}, nil }
func (r *rueidisLib) close(context.Context)                     { r.l.Close() }

type rueidisLocker struct {
	l       rueidislock.Locker
	release context.CancelFunc
	base    context.CancelFunc
}

// lock waits with a context that only the wait deadline cancels, and only while waiting: the
// hold's context must outlive the wait (rueidislock ends the hold when its context ends, and
// shortens its validity to that context's deadline).
func (r *rueidisLocker) lock(wait context.Context, key string) error {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	acquired := false
	stop := context.AfterFunc(wait, func() {
		mu.Lock()
		if !acquired {
			cancel()
		}
		mu.Unlock()
	})
	_, release, err := r.l.WithContext(ctx, key)
	mu.Lock()
	acquired = true
	mu.Unlock()
	stop()
	if err == nil && ctx.Err() != nil { // the wait ended just as it was granted: give it back
		release()
		err = wait.Err()
	}
	if err != nil {
		cancel()
		if werr := wait.Err(); werr != nil {
			return werr
		}
		return err
	}
	r.release, r.base = release, cancel
	return nil
}

func (r *rueidisLocker) unlock(context.Context) error {
	r.release() // deletes the key before returning
	r.base()
	r.release, r.base = nil, nil
	return nil
}

func (r *rueidisLocker) close() {}

// --- raw: SET key token NX PX 30000 and DEL (no ownership check), 1ms sleep while taken.

type rawLib struct{ rdb *redis.Client }

func (r *rawLib) newLocker(context.Context) (locker, error) { return &rawLocker{rdb: r.rdb}, nil }
func (r *rawLib) close(context.Context)                     {}

type rawLocker struct {
	rdb *redis.Client
	key string
	n   uint64
}

func (r *rawLocker) lock(ctx context.Context, key string) error {
	r.n++
	token := fmt.Sprintf("%p-%d", r, r.n)
	for {
		ok, err := r.rdb.SetNX(ctx, key, token, holdTTL).Result()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if ok {
			r.key = key
			return nil
		}
		if err := retryPause(ctx, time.Millisecond); err != nil {
			return err
		}
	}
}

func (r *rawLocker) unlock(ctx context.Context) error { return r.rdb.Del(ctx, r.key).Err() }
func (r *rawLocker) close()                           {}

// --- pg: session advisory locks, one connection per goroutine.

type pgLib struct{ url string }

func (p *pgLib) newLocker(ctx context.Context) (locker, error) {
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return nil, fmt.Errorf("pg: connect: %w", err)
	}
	return &pgLocker{conn: conn}, nil
}
func (p *pgLib) close(context.Context) {}

type pgLocker struct {
	conn *pgx.Conn
	id   int64
}

func pgKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}

func (p *pgLocker) lock(ctx context.Context, key string) error {
	id := pgKey(key)
	if _, err := p.conn.Exec(ctx, "SELECT pg_advisory_lock($1)", id); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	p.id = id
	return nil
}

func (p *pgLocker) unlock(ctx context.Context) error {
	var ok bool
	if err := p.conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", p.id).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errors.New("pg: advisory lock was not held")
	}
	return nil
}

func (p *pgLocker) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.conn.Close(ctx)
}
