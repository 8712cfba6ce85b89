package dlock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// invalidateChannel is where Redis delivers client-side-caching invalidations to a RESP2
// connection named by CLIENT TRACKING ... REDIRECT.
const invalidateChannel = "__redis__:invalidate"

const (
	// healthInterval is how often an idle notification connection (pub/sub and tracking) is
	// pinged: a connection that died (killed, reset, closed by the server's idle timeout) is
	// found within it, and every watched key is then read again, so a loss during the outage
	// is reported within about a second.
	healthInterval    = 400 * time.Millisecond
	confirmTimeout    = 300 * time.Millisecond // how long a waiter waits for SUBSCRIBE to be confirmed (then it polls)
	trackerTimeout    = 2 * time.Second        // bound on one tracking or confirming round trip
	trackDelay        = 2 * time.Millisecond   // a new hold's key is read (tracked) this long after it is taken
	recheckDelay      = 100 * time.Millisecond
	maxReceiveBackoff = 2 * time.Second
	minRehomeGap      = 500 * time.Millisecond // a node's connections are re-dialled at most this often
)

// idleChannelAfter: unused release channels are unsubscribed after this (a variable for tests;
// read when a notifier starts).
var idleChannelAfter = 10 * time.Second

// notifier owns the notification connections a Client keeps per Redis node. It serves two
// jobs:
//
//   - waking waiters: Lock subscribes to a lock's release channel before its attempt and is
//     woken when the holder's release script publishes (notify_wake.go);
//   - detecting lease loss: a second, private connection reads each held lock key with
//     CLIENT TRACKING ON REDIRECT <pub/sub connection>, so Redis pushes an invalidation the
//     moment anyone (a DEL from redis-cli included) changes or deletes the key. The checker
//     then re-reads the key and, when the hold looks gone, confirms that through the Client's
//     own go-redis client, which routes to the current master: only that definite answer ends
//     a lease (notify_loss.go).
//
// Both connections come from a private RESP2 client built from the node's options (its dialer
// included: a Sentinel failover client's asks the sentinels for the master), because go-redis
// does not expose a pub/sub connection's client id; an OnConnect hook captures it. When the
// node turns out not to be the master any more, the notifier re-dials (rehome), or on a
// Cluster hands its keys to the notifier of the slot's new master.
type notifier struct {
	c       *Client
	key     string        // in the Client's table: node address and DB
	opt     redis.Options // the node's options, adjusted, for every connection generation
	sharded bool          // Redis Cluster: lock channels are shard channels (SSUBSCRIBE)
	closing <-chan struct{}
	ctx     context.Context // cancelled on close
	psCtx   context.Context // ctx plus the mark that tells OnConnect a pub/sub connection is new
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	pubsubID  atomic.Int64  // CLIENT ID of the current pub/sub connection, once subscribed
	pendingID atomic.Int64  // CLIENT ID of a new pub/sub connection not yet subscribed
	epoch     atomic.Uint64 // bumped on every new pub/sub connection
	kick      chan struct{} // wakes the checker; buffered 1

	startOnce sync.Once
	started   chan struct{}

	psMu      sync.Mutex // serialises SUBSCRIBE/UNSUBSCRIBE and connection swaps
	nc        *redis.Client
	ps        *redis.PubSub
	gen       atomic.Uint64 // bumped by rehome: the checker re-opens tracking on the new client
	rehomedAt time.Time     // psMu

	mu         sync.Mutex
	chans      map[string]*channelState
	watched    map[string]map[*hold]uint64 // lock key -> leases held on it -> watch sequence
	watchSeq   uint64
	pending    map[string]struct{} // watched keys to re-read
	recheckAll bool
	noTracking bool          // CLIENT ID or TRACKING refused: loss is found by renewal only
	noPubSub   bool          // SUBSCRIBE refused: waiters poll
	denied     chan struct{} // closed when noPubSub is set
	noRole     bool          // ROLE refused: the notifier cannot tell a stale master by itself
	retired    bool          // removed from the Client: watch refuses, callers get a new notifier
	failing    bool          // the pub/sub connection keeps failing (logged once)
}

// pubsubConnKey marks the context of pub/sub calls so OnConnect knows which connection is new;
// its value is a genMark, so a connection of an older generation never passes for the current
// one's.
type pubsubConnKey struct{}

type genMark struct {
	n   *notifier
	gen uint64
}

func newNotifier(c *Client, node *redis.Client, sharded bool) *notifier {
	n := &notifier{
		c:       c,
		sharded: sharded,
		closing: c.bg.Done(),
		kick:    make(chan struct{}, 1),
		started: make(chan struct{}),
		denied:  make(chan struct{}),
		chans:   make(map[string]*channelState),
		watched: make(map[string]map[*hold]uint64),
		pending: make(map[string]struct{}),
	}
	opt := *node.Options()
	opt.Protocol = 2 // invalidations arrive as ordinary pub/sub messages
	opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.MaxActiveConns = 2, 0, 2, 0
	opt.ClientName = "dlock-notify"
	opt.ClientSideCache, opt.ClientSideCacheConfig = nil, nil
	opt.AutoPipelineOptions, opt.PushNotificationProcessor, opt.MaintNotificationsConfig = nil, nil, nil
	opt.Limiter = nil
	// Its calls end with their context (Close, a bounded check), not after a read timeout: a
	// re-dial to a frozen server must not hold Close up.
	opt.ContextTimeoutEnabled = true
	userHook := opt.OnConnect
	opt.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userHook != nil {
			if err := userHook(ctx, cn); err != nil {
				return err
			}
		}
		if m, ok := ctx.Value(pubsubConnKey{}).(genMark); !ok || m.n != n || m.gen != n.gen.Load() {
			return nil
		}
		id, err := cn.ClientID(ctx).Result()
		if isNoPerm(err) {
			// Without its id no tracking can be redirected to this connection; it still
			// wakes waiters. Refusing the connection would make go-redis re-dial forever.
			n.refuse(&n.noTracking, "CLIENT ID", err)
			return nil
		}
		if err != nil {
			return err
		}
		// go-redis re-subscribes right after this hook returns: until Redis confirms, no
		// channel of the new connection is live, and tracking must not redirect to it.
		n.pendingID.Store(id)
		n.unconfirmAll()
		return nil
	}
	n.opt = opt
	n.nc = n.newClient()
	ctx, cancel := context.WithCancel(context.Background())
	n.ctx, n.cancel = ctx, cancel
	n.psCtx = context.WithValue(ctx, pubsubConnKey{}, genMark{n, 0})
	return n
}

// start opens the pub/sub connection and starts the loops, once; it returns when that is done
// (or failed: go-redis retries the connection in the receive loop).
func (n *notifier) start() {
	n.startOnce.Do(func() {
		n.psMu.Lock()
		n.ps = n.nc.Subscribe(n.psCtx, invalidateChannel)
		n.psMu.Unlock()
		n.wg.Add(2)
		go n.receiveLoop()
		go n.checkLoop()
		close(n.started)
	})
	<-n.started
}

func (n *notifier) close() {
	n.cancel()
	n.startOnce.Do(func() { close(n.started) }) // never started: nothing to stop
	n.psMu.Lock()
	ps, nc := n.ps, n.nc
	n.psMu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
	n.wg.Wait()
	_ = nc.Close()
}

// newClient returns a client for a new connection generation, over its own copy of the
// options (which unname may change later). The caller holds psMu or owns n.
func (n *notifier) newClient() *redis.Client {
	o := n.opt
	return redis.NewClient(&o)
}

// current returns the connection generation in use: its client, pub/sub connection and the
// context its pub/sub calls carry.
func (n *notifier) current() (*redis.Client, *redis.PubSub, context.Context) {
	n.psMu.Lock()
	defer n.psMu.Unlock()
	return n.nc, n.ps, n.psCtx
}

// rehome replaces both connections with new ones, dialled afresh: the node they reached is not
// the master any more (a Sentinel failover, a paused master that came back demoted). The
// node's dialer finds the current master. Every channel is subscribed again and every watched
// key read again on the new connections.
func (n *notifier) rehome(why string) {
	n.psMu.Lock()
	if n.ctx.Err() != nil || time.Since(n.rehomedAt) < minRehomeGap {
		n.psMu.Unlock()
		return
	}
	n.rehomedAt = time.Now()
	gen := n.gen.Add(1) // before the new connection dials: its OnConnect checks the generation
	psCtx := context.WithValue(n.ctx, pubsubConnKey{}, genMark{n, gen})
	nc := n.newClient()
	n.psMu.Unlock()

	// Dial outside psMu, so waiters subscribing and Close are not held up by a slow server.
	ps := nc.Subscribe(psCtx, invalidateChannel)

	n.psMu.Lock()
	if n.ctx.Err() != nil || n.gen.Load() != gen {
		n.psMu.Unlock()
		_ = ps.Close()
		_ = nc.Close()
		return
	}
	oldNC, oldPS := n.nc, n.ps
	n.nc, n.ps, n.psCtx = nc, ps, psCtx
	n.mu.Lock()
	chans := make([]string, 0, len(n.chans))
	for ch, cs := range n.chans {
		chans = append(chans, ch)
		lapse(cs)
	}
	n.mu.Unlock()
	if len(chans) > 0 && !n.noPubSubNow() {
		if n.sharded {
			n.shardSubscribe(true, chans)
		} else {
			_ = n.ps.Subscribe(n.psCtx, chans...)
		}
	}
	n.psMu.Unlock()
	n.c.log.Info("dlock: notification connections re-dialled", "addr", n.opt.Addr, "why", why)
	_ = oldPS.Close() // ends the receive loop's wait on it
	_ = oldNC.Close()
	n.poke()
}

// unname re-dials the connections without a client name, which the user may not set.
func (n *notifier) unname(err error) {
	n.psMu.Lock()
	named := n.opt.ClientName != ""
	n.opt.ClientName = "" // live clients have their own copies (newClient)
	n.rehomedAt = time.Time{}
	n.psMu.Unlock()
	if named {
		n.c.log.Warn("dlock: Redis refused CLIENT SETNAME: notification connections go unnamed", "addr", n.opt.Addr, "err", err)
		n.rehome("CLIENT SETNAME refused")
	}
}

// refuse records that the server refused a feature's command (NOPERM, or unsupported): it is
// switched off for this node, said once in the log.
func (n *notifier) refuse(flag *bool, what string, err error) {
	n.mu.Lock()
	was := *flag
	*flag = true
	if flag == &n.noPubSub && !was {
		close(n.denied)
	}
	n.mu.Unlock()
	if was {
		return
	}
	var effect string
	switch flag {
	case &n.noTracking:
		effect = "lease loss is found by renewal and the safe deadline only, not pushed"
	case &n.noPubSub:
		effect = "waiters poll every 50ms instead of being woken"
	case &n.noRole:
		effect = "a stale master is found by confirming losses through the main client only"
	}
	n.c.log.Warn("dlock: Redis refused "+what+": "+effect+" (see README, minimal ACL)", "addr", n.opt.Addr, "err", err)
}

// idle reports whether the notifier serves nobody: no watched key, no waiter subscribed.
func (n *notifier) idle() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.idleLocked()
}

func (n *notifier) idleLocked() bool {
	if len(n.watched) > 0 {
		return false
	}
	for _, cs := range n.chans {
		if cs.refs > 0 {
			return false
		}
	}
	return true
}

func (n *notifier) noPubSubNow() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.noPubSub
}

// unconfirmAll marks every channel as not yet subscribed on a new connection.
func (n *notifier) unconfirmAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, cs := range n.chans {
		lapse(cs)
	}
}

// lapse marks a confirmed channel as not subscribed yet on a new connection (n.mu).
func lapse(cs *channelState) {
	if cs.confirmed {
		cs.confirmed, cs.lapsed, cs.ready = false, true, make(chan struct{})
	}
}

// reconnected runs when a new pub/sub connection receives invalidations: messages may have
// been missed while there was none, so every waiter retries and every watched key is read
// again (which re-arms tracking, redirected to the new connection). On a Cluster the lock
// channels are subscribed again here, slot by slot: go-redis re-subscribes them in one
// SSUBSCRIBE, which the node refuses (CROSSSLOT) when they are on two slots or more. Their
// waiters wake once more on the new confirmation.
func (n *notifier) reconnected() {
	n.mu.Lock()
	n.recheckAll = true
	var again []string
	for ch, cs := range n.chans {
		wakeAll(cs)
		if n.sharded {
			again = append(again, ch)
			lapse(cs)
		}
	}
	n.mu.Unlock()
	if len(again) > 0 {
		n.psMu.Lock()
		n.shardSubscribe(true, again)
		n.psMu.Unlock()
	}
	n.poke()
}

func (n *notifier) poke() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// isShardRefusal reports whether err is a Cluster node's refusal of a shard channel command:
// CROSSSLOT, MOVED, ASK, or CLUSTERDOWN (a slot not served by anyone).
func isShardRefusal(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	return strings.HasPrefix(msg, "CROSSSLOT") || strings.HasPrefix(msg, "MOVED") || strings.HasPrefix(msg, "ASK") ||
		strings.HasPrefix(msg, "CLUSTERDOWN")
}

// receiveLoop reads the pub/sub connection: confirmations, wake-ups and invalidations. An idle
// connection is pinged every healthInterval; a broken one is re-dialled by go-redis on the next
// receive, with backoff, and everything watched is read again.
func (n *notifier) receiveLoop() {
	defer n.wg.Done()
	var backoff time.Duration
	pinged := false // a PING went out and nothing has come back since
	for {
		_, ps, psCtx := n.current()
		msg, err := ps.ReceiveTimeout(psCtx, healthInterval)
		if n.ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				if pinged {
					// No PONG within a health interval: the connection is dead or its server
					// frozen (a paused or partitioned master). go-redis does not count a timeout
					// as a broken connection, so dial afresh (through Sentinel, if any).
					pinged = false
					n.rehome("the pub/sub connection went silent")
					continue
				}
				pinged = ps.Ping(psCtx) == nil
				continue
			case isNoPerm(err) && strings.Contains(err.Error(), "client|setname"):
				// The connection cannot even be named: go unnamed (operators lose the name
				// in CLIENT LIST, nothing else).
				n.unname(err)
				continue
			case isNoPerm(err) && strings.Contains(err.Error(), "channel"):
				n.refuse(&n.noPubSub, "SUBSCRIBE", err)
				continue
			case n.sharded && isShardRefusal(err):
				// A node's answer to an (S)SUBSCRIBE or SUNSUBSCRIBE it does not serve: go-redis's
				// own re-subscription of channels on several slots (subscribed again slot by slot
				// in reconnected), a channel whose slot moved away (its waiters' next attempt
				// finds the new master). The connection is fine.
				continue
			}
			if _, now, _ := n.current(); now != ps {
				continue // replaced by rehome
			}
			// A broken connection is re-dialled by go-redis on the next receive; a malformed
			// message (a FLUSHALL invalidation has no key list) means "anything may have
			// changed".
			n.mu.Lock()
			n.recheckAll = true
			logIt := !n.failing && backoff >= time.Second
			if logIt {
				n.failing = true
			}
			n.mu.Unlock()
			if logIt {
				n.c.log.Warn("dlock: notification connection failing; retrying with backoff", "addr", n.opt.Addr, "err", err)
			}
			n.poke()
			backoff = min(max(2*backoff, 50*time.Millisecond), maxReceiveBackoff)
			if backoff >= time.Second && n.idle() && n.c.retire(n) {
				return // a node that keeps failing and serves nobody (a dead Cluster master)
			}
			select {
			case <-n.ctx.Done():
				return
			case <-time.After(backoff):
			}
			continue
		}
		pinged = false
		if backoff > 0 {
			backoff = 0
			n.mu.Lock()
			was := n.failing
			n.failing = false
			n.mu.Unlock()
			if was {
				n.c.log.Info("dlock: notification connection back", "addr", n.opt.Addr)
			}
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			switch {
			case m.Kind == "subscribe" && m.Channel == invalidateChannel:
				n.pubsubID.Store(n.pendingID.Load())
				n.epoch.Add(1)
				n.reconnected()
			case m.Kind == "subscribe" || m.Kind == "ssubscribe":
				n.confirm(m.Channel)
			case m.Kind == "sunsubscribe":
				n.dropped(m.Channel)
			}
		case *redis.Message:
			if m.Channel == invalidateChannel {
				n.invalidated(m.PayloadSlice)
			} else {
				n.released(m.Channel, m.Payload)
			}
		}
	}
}

// isNoPerm reports an ACL refusal (go-redis prefixes one met while setting up a connection).
func isNoPerm(err error) bool {
	return err != nil && (strings.HasPrefix(err.Error(), "NOPERM") || strings.Contains(err.Error(), ": NOPERM "))
}
