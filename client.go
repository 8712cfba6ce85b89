package dlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// abandonTimeout bounds the background clean-up of an acquire whose reply was lost.
const abandonTimeout = 5 * time.Second

// ownCleanup returns the context of a clean-up that gives back what a call on ctx may have
// taken (a hold it will not hand out, an acquire whose reply was lost), bounded by d. On work
// Close waits for (closeWaits): c.cleanup while the Client is open (Close's cut ends it);
// once Close has begun, a context of its own, which that cut does not end (a hold it took
// would otherwise stay held for its whole TTL), ending at the latest lateGiveBack after
// Close's bound (closeBy), so that Close returns by then however many give-backs that work
// makes (with go-redis, plus a read timeout: it honours a deadline only with
// ContextTimeoutEnabled). Elsewhere (a Lock or TryLock on the caller's goroutine, which Close
// does not wait for) a context of its own, not ended by Close: d, and once Close has begun
// lateGiveBack at most, however late it comes.
func (c *Client) ownCleanup(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	waited := ctx.Value(closeWaitsFor{}) != nil
	if c.checkOpen() == nil {
		if waited {
			return context.WithTimeout(c.cleanup, d)
		}
		return context.WithTimeout(context.Background(), d)
	}
	end := time.Now().Add(min(d, lateGiveBack))
	if by := c.closeBy.Load().Add(lateGiveBack); waited && by.Before(end) {
		end = by
	}
	return context.WithDeadline(context.Background(), end)
}

// closeWaitsFor marks the context of work Close waits for (closeWaits).
type closeWaitsFor struct{}

// closeWaits marks ctx as the context of work that holds a slot of the Client's background
// work (goBackground), which Close waits for: its give-backs after Close has begun end by
// Close's bound plus lateGiveBack (ownCleanup).
func closeWaits(ctx context.Context) context.Context {
	return context.WithValue(ctx, closeWaitsFor{}, true)
}

// lateGiveBack is how long after Close's bound a give-back may still run (ownCleanup).
const lateGiveBack = time.Second

// CloseTimeout bounds how long Client.Close spends giving leases back and letting background
// clean-up finish when its ctx has no earlier deadline.
const CloseTimeout = 2 * time.Second

// A Client makes locks on one Redis deployment. It owns the background work its leases share:
// one renewer that batches every lease's watchdog renewal, and one notification connection
// per Redis node for release wake-ups and lease-loss pushes. Create one per process (with New
// or NewRedlock: the zero Client, like the zero Mutex and other handles not made by a
// Client's methods, is not usable) and share it; it is safe for concurrent use. Close it to
// stop that work.
type Client struct {
	rdb redis.UniversalClient
	cfg config
	err error  // invalid client options, reported by every Lock and TryLock
	id  string // the owner id of this Client's cohorts (128-bit random)
	// cohortEpoch suffixes the cohorts' owner ids once an attempt of one had an unknown
	// outcome (cohort.renewOwnerLocked), so that attempt, reaching Redis late, is a stranger
	// to every later hold of the Client's cohorts.
	cohortEpoch atomic.Uint64
	nonce       string // random per Client, so hold ids never repeat across processes
	seq         atomic.Uint64
	renew       *renewer
	publishCmd  string // PUBLISH, or SPUBLISH on Redis Cluster
	// replicaReads: rdb sends read commands to replicas (a Cluster client with ReadOnly,
	// RouteByLatency or RouteRandomly), so dlock reads its state through ReadFields instead.
	replicaReads bool
	clock        func() time.Time

	log *slog.Logger
	obs *Observer // WithObserver's, or nil

	bg          context.Context // background work's context, cancelled when Close starts
	stop        context.CancelFunc
	cleanup     context.Context // clean-up calls' context, cancelled when Close gives up on them
	stopCleanup context.CancelFunc
	wg          sync.WaitGroup
	checkOnce   sync.Once
	closeBy     atomic.Pointer[time.Time] // Close's bound (set before Close closes bg)

	mu        sync.Mutex
	closed    bool
	drained   bool                 // Close ended background clean-up: no new goroutine starts
	renewing  bool                 // the renewer goroutine was started
	notifiers map[string]*notifier // by node address
	holds     map[*hold]struct{}
	cohorts   map[string]*cohort    // by lock key
	shares    map[string]*readShare // open shared read holds, by lock key (readshare.go)
	// pendingReads: a reader waiting in Redis on behalf of the Client's readers, by lock key
	pendingReads map[string]*pendingRead

	rl *redlock // NewRedlock's masters, or nil

	runner ScriptRunner // WithScriptRunner's, or nil: go-redis runs the scripts
}

// New returns a Client over rdb: a *redis.Client (standalone or failover/Sentinel) or a
// *redis.ClusterClient; other UniversalClients work without push loss detection. Options set
// the defaults for every Mutex of this Client. New neither contacts Redis nor starts any
// goroutine (that waits for the first lease); a nil rdb or an invalid option is reported by
// every Lock and TryLock as ErrInvalid.
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	c := newClient(rdb, opts)
	if isNil(rdb) {
		c.err = join(c.err, fmt.Errorf("%w: nil Redis client", ErrInvalid))
	}
	return c
}

// newClient returns a Client over rdb (nil for a Redlock's, whose masters have Clients of
// their own) with its options checked.
func newClient(rdb redis.UniversalClient, opts []Option) *Client {
	c := &Client{
		rdb:          rdb,
		cfg:          config{}.apply(opts),
		notifiers:    make(map[string]*notifier),
		holds:        make(map[*hold]struct{}),
		cohorts:      make(map[string]*cohort),
		shares:       make(map[string]*readShare),
		pendingReads: make(map[string]*pendingRead),
		id:           newOwnerID(),
		nonce:        randomHex(8),
	}
	c.publishCmd = "PUBLISH"
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		c.publishCmd = "SPUBLISH" // one shard, not the whole cluster bus
		// A nil one is reported by New, as ErrInvalid from every call.
		if cc != nil {
			o := cc.Options()
			c.replicaReads = o.ReadOnly || o.RouteByLatency || o.RouteRandomly
		}
	}
	c.bg, c.stop = context.WithCancel(context.Background())
	c.cleanup, c.stopCleanup = context.WithCancel(context.Background())
	c.err = c.cfg.validate()
	c.log = c.cfg.logger
	c.obs = c.cfg.observer
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.runner = c.cfg.runner
	if !c.cfg.runnerSet && !c.cfg.onGoRedis && testRunner != nil && !isNil(rdb) {
		c.runner = testRunner(rdb)
	}
	if isNilRunner(c.runner) {
		c.runner = nil // reported by validate
	}
	c.clock = c.cfg.clock
	if c.clock == nil {
		c.clock = time.Now
	}
	c.renew = newRenewer(c)
	return c
}

// Close ends the Client: every Lock and TryLock still waiting returns ErrClosed at once (one
// inside a go-redis call returns when that call does: go-redis's own retries, such as its
// back-off while a server loads its data, are not cut short; a lock such a call takes is
// given back, not left held); every lease still held is released (best effort) and ends
// with ErrClosed; renewal stops and the notification connections close. Leases it could not
// release expire within their TTL. Lock and TryLock fail with ErrClosed afterwards. Close does
// not close rdb.
//
// Close returns within CloseTimeout (or by ctx's deadline, if sooner), plus at most one
// go-redis read timeout for calls already in flight when Redis is down (an Extend in flight
// is cut short then), and when such a call took a lock it must give back, or a waiter leaving
// the queue must pass a grant on, one second more (with go-redis, up to one more read
// timeout). It returns the release errors, if any.
func (c *Client) Close(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background() // Close must close: a nil ctx only means no deadline of its own
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	by := time.Now().Add(CloseTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(by) {
		by = d
	}
	if ctx.Err() != nil {
		by = time.Now() // ended already: Close gives up on its clean-up at once
	}
	c.closeBy.Store(&by) // before bg ends: whoever sees Close begun sees its bound
	c.stop()
	held := make([]*hold, 0, len(c.holds))
	for h := range c.holds {
		held = append(held, h)
	}
	nots := c.notifiers
	c.notifiers = nil
	c.mu.Unlock()

	rctx, cancel := context.WithTimeout(ctx, CloseTimeout)
	defer cancel()
	errs := make([]error, len(held))
	var wg sync.WaitGroup
	for i, h := range held {
		if !h.beginRelease() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := h.release(rctx); err != nil {
				errs[i] = redisErr("close: release", h.name, err)
			}
			h.end(ErrClosed, true)
		}()
	}
	wg.Wait()
	// Background clean-up (releases of failed Unlocks, abandoned acquires, waiters leaving
	// the queue) may finish within the same bound, then is cut short.
	go func() {
		<-rctx.Done()
		c.stopCleanup()
	}()
	c.mu.Lock()
	c.drained = true
	c.mu.Unlock()
	if now := time.Now(); now.After(by) {
		// The releases above overran the bound (go-redis waits out a read timeout whatever
		// the ctx): give-backs of the work Close now waits for still get lateGiveBack.
		c.closeBy.Store(&now)
	}
	c.wg.Wait()
	c.stopCleanup()
	for _, n := range nots {
		n.close()
	}
	if c.rl != nil {
		errs = append(errs, c.rl.close(ctx)) // the masters' Clients hold the leases
	}
	return join(errs...)
}

func (c *Client) checkOpen() error {
	select {
	case <-c.bg.Done():
		return ErrClosed
	default:
		return nil
	}
}

// track registers a fresh hold: safe-deadline timer, renewal, loss push. It fails with
// ErrClosed when the Client closed meanwhile.
func (c *Client) track(ctx context.Context, l *hold, sent time.Time) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.holds[l] = struct{}{}
	if !c.renewing { // the renewer starts with the first lease, so an unused Client costs nothing
		c.renewing = true
		c.wg.Add(1) // under c.mu with closed false: Close's Wait sees it
		go func() {
			defer c.wg.Done()
			c.renew.run(c.bg)
		}()
	}
	c.mu.Unlock()
	c.checkServer()

	l.mu.Lock()
	held := l.state == holdHeld // Close may have ended it already
	if held {
		l.setDeadlineLocked(sent, l.liveTTL(), false)
	}
	l.mu.Unlock()
	if !held {
		return nil
	}
	c.watchOn(ctx, c.notifierFor(ctx, l.keys.lock), l)
	if !l.cfg.fixedLease {
		c.renew.add(l, sent)
	}
	return nil
}

// watchOn makes n (the notifier of h's node, or nil) watch h, taking the node's new notifier if
// n retired meanwhile.
func (c *Client) watchOn(ctx context.Context, n *notifier, h *hold) {
	for try := 0; n != nil && try < 3; try++ {
		h.mu.Lock()
		h.notif = n
		h.mu.Unlock()
		if n.watch(h.keys.lock, h) {
			return
		}
		n = c.notifierFor(ctx, h.keys.lock)
	}
	h.mu.Lock()
	h.notif = nil
	h.mu.Unlock()
}

// goBackground reserves a slot for a background goroutine (the caller starts it and calls
// c.wg.Done when it ends). It reports false once Close has stopped background work, so
// Close's Wait never races with a new Add; until then Close waits for them (bounded by
// c.cleanup, which their Redis calls use).
func (c *Client) goBackground() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drained {
		return false
	}
	c.wg.Add(1)
	return true
}

// forget drops an ended hold from the Client.
func (c *Client) forget(h *hold) {
	c.mu.Lock()
	delete(c.holds, h)
	c.mu.Unlock()
}

// notifierFor returns the notifier of the node that holds key, starting it on first use, or
// nil when the client type offers no per-node connection (then waiters poll and loss is found
// by renewal and the safe deadline only).
func (c *Client) notifierFor(ctx context.Context, key string) *notifier {
	var node *redis.Client
	switch r := c.rdb.(type) {
	case *redis.Client:
		node = r
	case *redis.ClusterClient:
		var err error
		if node, err = r.MasterForKey(ctx, key); err != nil {
			return nil
		}
	default:
		return nil
	}
	addr := node.Options().Addr + "/" + strconv.Itoa(node.Options().DB)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	n := c.notifiers[addr]
	if n == nil {
		n = newNotifier(c, node, c.publishCmd == "SPUBLISH")
		n.key = addr
		c.notifiers[addr] = n
	}
	c.mu.Unlock()
	n.start() // dials outside c.mu: a slow node must not block every other lock
	return n
}

// retire removes a notifier that serves nobody and whose node keeps failing from the Client
// and closes it in the background; the next lock on that node gets a new one. It reports
// false when the Client is closing (Close closes the notifier then).
func (c *Client) retire(n *notifier) bool {
	c.mu.Lock()
	if c.closed || c.notifiers[n.key] != n {
		c.mu.Unlock()
		return false
	}
	// Decided under n.mu, so no hold is watched on n after it retired (watch refuses then).
	n.mu.Lock()
	idle := n.idleLocked()
	n.retired = idle
	n.mu.Unlock()
	if !idle {
		c.mu.Unlock()
		return false
	}
	delete(c.notifiers, n.key)
	c.wg.Add(1) // under c.mu with closed false: Close's Wait sees it
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		n.close()
	}()
	return true
}

// nextHoldID returns an id unique to one Lock/TryLock call across all processes.
func (c *Client) nextHoldID() string {
	return c.nonce + strconv.FormatUint(c.seq.Add(1), 36)
}

func newOwnerID() string { return randomHex(16) }

// isNilValue reports whether v is nil or a nil pointer (a typed nil in an interface).
func isNilValue(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// isNil reports a nil client, including a typed nil pointer in the interface, whose methods
// would panic.
func isNil(rdb redis.UniversalClient) bool {
	switch r := rdb.(type) {
	case nil:
		return true
	case *redis.Client:
		return r == nil
	case *redis.ClusterClient:
		return r == nil
	case *redis.Ring:
		return r == nil
	}
	return false
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms (Go 1.24+)
	return hex.EncodeToString(b)
}

// now reads the Client's clock (WithClock). Every lease deadline, renewal time and hand-off
// batch is measured with it, as a difference between two readings.
func (c *Client) now() time.Time { return c.clock() }

func (c *Client) since(t time.Time) time.Duration { return c.now().Sub(t) }

func (c *Client) until(t time.Time) time.Duration { return t.Sub(c.now()) }
