package main

// Adapters for the read-heavy and multi-lock scenarios. A rwLocker takes one name to read or
// to write; a multiLocker takes several names together. Like locker, each is used by one
// goroutine, waits until held or ctx ends, and calls a library that gives up on its own again.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/dlock-go/dlock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jackc/pgx/v5"
)

type rwLocker interface {
	lock(ctx context.Context, key string, write bool) error
	unlock(ctx context.Context) error
	close()
}

type multiLocker interface {
	lock(ctx context.Context, keys []string) error // keys are distinct, in any order
	unlock(ctx context.Context) error
	close()
}

// newRWLocker makes one goroutine's rwLocker for the read-heavy scenario.
func newRWLocker(ctx context.Context, name string, e *env, c *dlock.Client) (rwLocker, error) {
	switch name {
	case "dlock-rw":
		return &dlockRW{c: c}, nil
	case "dlock": // the same workload under a Mutex: reads exclude each other too
		return &dlockRW{c: c, mutex: true}, nil
	case "local-rw": // the workload's ceiling: an in-memory lock, no hand-off between processes
		return &localRW{mu: &localRWMu}, nil
	case "pg-rw":
		if e.pgURL == "" {
			return nil, errors.New("pg-rw: PG_URL is not set")
		}
		conn, err := pgx.Connect(ctx, e.pgURL)
		if err != nil {
			return nil, fmt.Errorf("pg-rw: connect: %w", err)
		}
		return &pgRW{conn: conn}, nil
	}
	return nil, fmt.Errorf("unknown read-write library %q", name)
}

// newMultiLocker makes one goroutine's multiLocker for the multi-lock scenario.
func newMultiLocker(name string, e *env, c *dlock.Client) (multiLocker, error) {
	switch name {
	case "dlock":
		return &dlockMulti{c: c}, nil
	case "redsync-chain-1ms", "redsync-chain-10ms", "redsync-chain-100ms":
		d, err := chainDelay(name)
		if err != nil {
			return nil, err
		}
		return &redsyncChain{rs: redsync.New(rsgoredis.NewPool(e.rdb)), delay: d,
			ms: map[string]*redsync.Mutex{}}, nil
	case "redislock-chain-1ms", "redislock-chain-10ms", "redislock-chain-100ms":
		d, err := chainDelay(name)
		if err != nil {
			return nil, err
		}
		return &redislockChain{c: redislock.New(e.rdb), delay: d}, nil
	}
	return nil, fmt.Errorf("unknown multi-lock library %q", name)
}

// chainDelay reads the retry delay from a chain library's name ("…-10ms").
func chainDelay(name string) (time.Duration, error) {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '-' {
			return time.ParseDuration(name[i+1:])
		}
	}
	return 0, fmt.Errorf("no delay in %q", name)
}

// --- dlock RWMutex (or Mutex), one handle per goroutine and name (reused).

type dlockRW struct {
	c     *dlock.Client
	mutex bool
	key   string
	rw    *dlock.RWMutex
	m     *dlock.Mutex
	l     *dlock.Lease
}

func (d *dlockRW) lock(ctx context.Context, key string, write bool) error {
	if d.key != key {
		d.key, d.rw, d.m = key, d.c.RWMutex(key), d.c.Mutex(key)
	}
	var l *dlock.Lease
	var err error
	switch {
	case d.mutex:
		l, err = d.m.Lock(ctx)
	case write:
		l, err = d.rw.Lock(ctx)
	default:
		l, err = d.rw.RLock(ctx)
	}
	if err != nil {
		return err
	}
	d.l = l
	return nil
}

func (d *dlockRW) unlock(ctx context.Context) error { return unlockLease(ctx, &d.l) }
func (d *dlockRW) close()                           {}

// unlockLease unlocks *l and clears it; a lease lost while held is an error (the critical
// section was not protected).
func unlockLease(ctx context.Context, l **dlock.Lease) error {
	ls := *l
	*l = nil
	if err := ls.Err(); err != nil {
		_ = ls.Unlock(ctx)
		return fmt.Errorf("lease lost while held: %w", err)
	}
	return ls.Unlock(ctx)
}

// --- local-rw: Go's sync.RWMutex, shared by the goroutines of one process. Not a distributed
// lock: it measures what the read-heavy workload allows when a hand-off costs almost nothing
// (a blocked Lock keeps new readers out, as RWMutex's FIFO does), so it runs in a scenario of
// one process only.

// localRWMu is the one name's lock of the worker process.
var localRWMu sync.RWMutex

type localRW struct {
	mu    *sync.RWMutex
	write bool
}

func (l *localRW) lock(_ context.Context, _ string, write bool) error {
	if write {
		l.mu.Lock()
	} else {
		l.mu.RLock()
	}
	l.write = write
	return nil
}

func (l *localRW) unlock(context.Context) error {
	if l.write {
		l.mu.Unlock()
	} else {
		l.mu.RUnlock()
	}
	return nil
}

func (l *localRW) close() {}

// --- pg: pg_advisory_lock_shared to read, pg_advisory_lock to write, one connection per goroutine.

type pgRW struct {
	conn  *pgx.Conn
	id    int64
	write bool
}

func (p *pgRW) lock(ctx context.Context, key string, write bool) error {
	q := "SELECT pg_advisory_lock_shared($1)"
	if write {
		q = "SELECT pg_advisory_lock($1)"
	}
	id := pgKey(key)
	if _, err := p.conn.Exec(ctx, q, id); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	p.id, p.write = id, write
	return nil
}

func (p *pgRW) unlock(ctx context.Context) error {
	q := "SELECT pg_advisory_unlock_shared($1)"
	if p.write {
		q = "SELECT pg_advisory_unlock($1)"
	}
	var ok bool
	if err := p.conn.QueryRow(ctx, q, p.id).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errors.New("pg: advisory lock was not held")
	}
	return nil
}

func (p *pgRW) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.conn.Close(ctx)
}

// --- dlock MultiLock: a fresh handle per call (handles are cheap and hold no state).

type dlockMulti struct {
	c *dlock.Client
	l *dlock.Lease
}

func (d *dlockMulti) lock(ctx context.Context, keys []string) error {
	l, err := d.c.MultiLock(keys).Lock(ctx)
	if err != nil {
		return err
	}
	d.l = l
	return nil
}

func (d *dlockMulti) unlock(ctx context.Context) error { return unlockLease(ctx, &d.l) }
func (d *dlockMulti) close()                           {}

// --- ordered chains: take the names one by one in sorted order (so no two chains wait for each
// other in a cycle), keeping what is held; release in reverse order.

type redsyncChain struct {
	rs    *redsync.Redsync
	delay time.Duration
	ms    map[string]*redsync.Mutex // one Mutex per name (reused)
	held  []*redsync.Mutex
}

func (r *redsyncChain) lock(ctx context.Context, keys []string) error {
	for _, k := range slices.Sorted(slices.Values(keys)) {
		m := r.ms[k]
		if m == nil {
			m = r.rs.NewMutex(k, redsync.WithRetryDelay(r.delay), redsync.WithTries(1<<20))
			r.ms[k] = m
		}
		if err := (&redsyncLocker{m: m, key: k}).lock(ctx, k); err != nil {
			giveBack(ctx, r.unlock)
			return err
		}
		r.held = append(r.held, m)
	}
	return nil
}

func (r *redsyncChain) unlock(ctx context.Context) error {
	var errs []error
	for i := len(r.held) - 1; i >= 0; i-- {
		if ok, err := r.held[i].UnlockContext(ctx); err != nil || !ok {
			errs = append(errs, cmpErr(err, "redsync: unlock refused"))
		}
	}
	r.held = r.held[:0]
	return errors.Join(errs...)
}

func (r *redsyncChain) close() {}

type redislockChain struct {
	c     *redislock.Client
	delay time.Duration
	held  []*redislock.Lock
}

func (r *redislockChain) lock(ctx context.Context, keys []string) error {
	rl := &redislockLocker{lib: &redislockLib{c: r.c, backoff: r.delay}}
	for _, k := range slices.Sorted(slices.Values(keys)) {
		if err := rl.lock(ctx, k); err != nil {
			giveBack(ctx, r.unlock)
			return err
		}
		r.held = append(r.held, rl.l)
	}
	return nil
}

func (r *redislockChain) unlock(ctx context.Context) error {
	var errs []error
	for i := len(r.held) - 1; i >= 0; i-- {
		if err := r.held[i].Release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	r.held = r.held[:0]
	return errors.Join(errs...)
}

func (r *redislockChain) close() {}

// giveBack releases what a chain holds after a link failed (ctx may have ended).
func giveBack(ctx context.Context, unlock func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = unlock(ctx)
}

func cmpErr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}
