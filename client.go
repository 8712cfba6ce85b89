package dlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// abandonTimeout bounds the background clean-up of an acquire whose reply was lost.
const abandonTimeout = 5 * time.Second

// A Client makes locks on one Redis deployment. It owns the background work its leases share:
// one renewer that batches every lease's watchdog renewal, and one notification connection
// per Redis node for release wake-ups and lease-loss pushes. Create one per process and
// share it; it is safe for concurrent use. Close it to stop that work.
type Client struct {
	rdb   redis.UniversalClient
	cfg   config
	err   error  // invalid client options, reported by every Lock and TryLock
	nonce string // random per Client, so hold ids never repeat across processes
	seq   atomic.Uint64
	renew *renewer

	bg   context.Context // background work's context, cancelled by Close
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	renewing  bool                 // the renewer goroutine was started
	notifiers map[string]*notifier // by node address
	leases    map[*Lease]struct{}
}

// New returns a Client over rdb: a *redis.Client (standalone or failover/Sentinel) or a
// *redis.ClusterClient; other UniversalClients work without push loss detection. Options set
// the defaults for every Mutex of this Client. New neither contacts Redis nor starts any
// goroutine (that waits for the first lease); a nil rdb or an invalid option is reported by
// every Lock and TryLock as ErrInvalid.
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	c := &Client{
		rdb:       rdb,
		cfg:       config{}.apply(opts),
		notifiers: make(map[string]*notifier),
		leases:    make(map[*Lease]struct{}),
		nonce:     randomHex(8),
	}
	c.bg, c.stop = context.WithCancel(context.Background())
	c.err = c.cfg.validate()
	if rdb == nil {
		c.err = fmt.Errorf("%w: nil Redis client", ErrInvalid)
	}
	c.renew = newRenewer(c)
	return c
}

// Close ends the Client: it releases every lease still held (best effort, bounded by ctx),
// ends them with ErrClosed, stops renewal and closes the notification connections. Leases it
// could not release expire within their TTL. Lock and TryLock fail with ErrClosed afterwards.
// Close does not close rdb. It returns the first release error, if any.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.stop()
	held := make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		held = append(held, l)
	}
	nots := c.notifiers
	c.notifiers = nil
	c.mu.Unlock()

	var first error
	for _, l := range held {
		l.mu.Lock()
		owned := l.state == leaseHeld
		if owned {
			l.state = leaseReleasing
		}
		l.mu.Unlock()
		if !owned {
			continue
		}
		if _, err := l.release(ctx); err != nil && first == nil {
			first = fmt.Errorf("dlock: close: release %q: %w", l.m.name, err)
		}
		l.finish(ErrClosed, true)
	}
	c.wg.Wait()
	for _, n := range nots {
		n.close()
	}
	return first
}

func (c *Client) checkOpen() error {
	select {
	case <-c.bg.Done():
		return ErrClosed
	default:
		return nil
	}
}

// track registers a fresh lease: safe-deadline timer, renewal, loss push. It fails with
// ErrClosed when the Client closed meanwhile.
func (c *Client) track(ctx context.Context, l *Lease, sent time.Time) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.leases[l] = struct{}{}
	if !c.renewing { // the renewer starts with the first lease, so an unused Client costs nothing
		c.renewing = true
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.renew.run(c.bg)
		}()
	}
	c.mu.Unlock()

	n := c.notifierFor(ctx, l.m.keys.lock)
	l.mu.Lock()
	l.notif = n
	l.mu.Unlock()
	if n != nil {
		n.watch(l.m.keys.lock, l)
	}
	l.mu.Lock()
	held := l.state == leaseHeld // a pushed loss or Close may have ended it already
	if held {
		l.setDeadlineLocked(sent)
	}
	l.mu.Unlock()
	if !held {
		if n != nil {
			n.unwatch(l.m.keys.lock, l)
		}
		return nil
	}
	if !l.m.cfg.fixedLease {
		c.renew.add(l, sent)
	}
	return nil
}

// forget drops an ended lease from the Client.
func (c *Client) forget(l *Lease) {
	c.mu.Lock()
	delete(c.leases, l)
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
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	n := c.notifiers[addr]
	if n == nil {
		n = newNotifier(node)
		c.notifiers[addr] = n
	}
	return n
}

// abandon undoes, in the background, an acquire whose reply was lost, if Redis applied it.
func (c *Client) abandon(m *Mutex, holdID string) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
		defer cancel()
		l := &Lease{m: m, holdID: holdID}
		_, _ = l.releaseIfAcquired(ctx)
	}()
}

// nextHoldID returns an id unique to one Lock/TryLock call across all processes.
func (c *Client) nextHoldID() string {
	return c.nonce + strconv.FormatUint(c.seq.Add(1), 36)
}

func newOwnerID() string { return randomHex(16) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms (Go 1.24+)
	return hex.EncodeToString(b)
}
