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
	receiveTimeout   = 10 * time.Second     // idle time before the notifier pings its connection
	confirmTimeout   = 2 * time.Second      // how long a waiter waits for SUBSCRIBE to be confirmed
	idleChannelAfter = 10 * time.Second     // unused release channels are unsubscribed after this
	trackerTimeout   = 2 * time.Second      // bound on one tracking round trip
	trackDelay       = 2 * time.Millisecond // a new hold's key is read (tracked) this long after it is taken
)

// notifier owns the one notification connection a Client keeps per Redis node. It serves two
// jobs on that single pub/sub connection:
//
//   - waking waiters: Lock subscribes to a lock's release channel before its attempt and is
//     woken when the holder's release script publishes;
//   - detecting lease loss: a second, private connection reads each held lock key with
//     CLIENT TRACKING ON REDIRECT <pub/sub connection>, so Redis pushes an invalidation the
//     moment anyone (a DEL from redis-cli included) changes or deletes the key. The checker
//     then re-reads the key (which also re-arms tracking) and ends the leases whose owner is
//     gone. This needs no server configuration, unlike keyspace notifications.
//
// Both connections come from a private RESP2 client built from the node's options, because
// go-redis does not expose a pub/sub connection's client id; an OnConnect hook captures it.
type notifier struct {
	nc     *redis.Client
	ps     *redis.PubSub
	ctx    context.Context // cancelled on close
	psCtx  context.Context // ctx plus the mark that tells OnConnect a pub/sub connection is new
	cancel context.CancelFunc
	wg     sync.WaitGroup

	pubsubID  atomic.Int64  // CLIENT ID of the current pub/sub connection, once subscribed
	pendingID atomic.Int64  // CLIENT ID of a new pub/sub connection not yet subscribed
	epoch     atomic.Uint64 // bumped on every new pub/sub connection
	kick      chan struct{} // wakes the checker; buffered 1

	startOnce sync.Once
	started   chan struct{}
	psMu      sync.Mutex // serialises SUBSCRIBE/UNSUBSCRIBE with the channel table

	mu         sync.Mutex
	chans      map[string]*channelState
	watched    map[string]map[*hold]uint64 // lock key -> leases held on it -> watch sequence
	watchSeq   uint64
	pending    map[string]struct{} // watched keys to re-read
	recheckAll bool
	noTracking bool            // the server refused CLIENT TRACKING: loss is found by renewal only
	sharded    bool            // Redis Cluster: lock channels are shard channels (SSUBSCRIBE)
	closing    <-chan struct{} // closed when the Client starts closing: waits end at once
}

type channelState struct {
	refs      int
	confirmed bool
	ready     chan struct{}            // closed when SUBSCRIBE is confirmed
	waiters   map[chan struct{}]string // wake-up channel -> the waiter's owner id
	idleSince time.Time
}

// pubsubConnKey marks the context of pub/sub calls so OnConnect knows which connection is new.
type pubsubConnKey struct{}

func newNotifier(node *redis.Client, sharded bool, closing <-chan struct{}) *notifier {
	n := &notifier{
		sharded: sharded,
		closing: closing,
		kick:    make(chan struct{}, 1),
		started: make(chan struct{}),
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
	userHook := opt.OnConnect
	opt.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userHook != nil {
			if err := userHook(ctx, cn); err != nil {
				return err
			}
		}
		if ctx.Value(pubsubConnKey{}) != n {
			return nil
		}
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		// go-redis re-subscribes right after this hook returns: until Redis confirms, no
		// channel of the new connection is live, and tracking must not redirect to it.
		n.pendingID.Store(id)
		n.unconfirmAll()
		return nil
	}
	n.nc = redis.NewClient(&opt)
	ctx, cancel := context.WithCancel(context.Background())
	n.ctx, n.cancel = ctx, cancel
	n.psCtx = context.WithValue(ctx, pubsubConnKey{}, n)
	return n
}

// start opens the pub/sub connection and starts the loops, once; it returns when that is done
// (or failed: go-redis retries the connection in the receive loop).
func (n *notifier) start() {
	n.startOnce.Do(func() {
		ps := n.nc.Subscribe(n.psCtx, invalidateChannel)
		n.psMu.Lock()
		n.ps = ps
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
	ps := n.ps
	n.psMu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
	n.wg.Wait()
	_ = n.nc.Close()
}

// unconfirmAll marks every channel as not yet subscribed on a new connection.
func (n *notifier) unconfirmAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, cs := range n.chans {
		if cs.confirmed {
			cs.confirmed, cs.ready = false, make(chan struct{})
		}
	}
}

// reconnected runs when a new pub/sub connection receives invalidations: messages may have
// been missed while there was none, so every waiter retries and every watched key is read
// again (which re-arms tracking, redirected to the new connection).
func (n *notifier) reconnected() {
	n.mu.Lock()
	n.recheckAll = true
	for _, cs := range n.chans {
		wakeAll(cs)
	}
	n.mu.Unlock()
	n.poke()
}

func (n *notifier) poke() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func wakeAll(cs *channelState) { wake(cs, "") }

// wake wakes the waiters of owner, or all waiters when owner is "".
func wake(cs *channelState, owner string) {
	for w, o := range cs.waiters {
		if owner != "" && o != owner {
			continue
		}
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

func (n *notifier) receiveLoop() {
	defer n.wg.Done()
	for {
		msg, err := n.ps.ReceiveTimeout(n.psCtx, receiveTimeout)
		if n.ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				_ = n.ps.Ping(n.psCtx) // keeps a silently dead connection from going unnoticed
				continue
			}
			// A broken connection is redialled by go-redis on the next call; a malformed message
			// (a FLUSHALL invalidation has no key list) means "anything may have changed".
			n.mu.Lock()
			n.recheckAll = true
			n.mu.Unlock()
			n.poke()
			select {
			case <-n.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
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
			}
		case *redis.Message:
			if m.Channel == invalidateChannel {
				n.invalidated(m.PayloadSlice)
			} else {
				// "g <owner>": a release granted the lock to owner; "w <owner>": it freed the
				// lock for owner, first in line, to compete for; either way only that waiter
				// wakes. "r": freed with nobody queued, so anyone may take it.
				owner := ""
				if len(m.Payload) > 2 && m.Payload[1] == ' ' {
					owner = m.Payload[2:]
				}
				n.mu.Lock()
				if cs := n.chans[m.Channel]; cs != nil {
					wake(cs, owner)
				}
				n.mu.Unlock()
			}
		}
	}
}

func (n *notifier) confirm(channel string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cs := n.chans[channel]; cs != nil && !cs.confirmed {
		cs.confirmed = true
		close(cs.ready)
	}
}

func (n *notifier) invalidated(keys []string) {
	n.mu.Lock()
	hit := false
	for _, k := range keys {
		if _, ok := n.watched[k]; ok {
			n.pending[k] = struct{}{}
			hit = true
		}
	}
	n.mu.Unlock()
	if hit {
		n.poke()
	}
}

func (n *notifier) subscribeCmd(channel string) error {
	if n.sharded {
		return n.ps.SSubscribe(n.psCtx, channel)
	}
	return n.ps.Subscribe(n.psCtx, channel)
}

// subscribed reports whether channel is already subscribed and confirmed (a hot lock).
func (n *notifier) subscribed(channel string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.chans[channel]
	return cs != nil && cs.confirmed
}

// A subscription is one waiter's interest in a release channel.
type subscription struct {
	n         *notifier
	channel   string
	c         chan struct{}
	confirmed bool // false: the channel may not be subscribed, so the waiter must poll
}

// subscribe registers a waiter on channel and returns once Redis confirmed the subscription
// (or after confirmTimeout or when ctx ends, with confirmed false), so a release published
// after this returns is never missed while the connection stays up.
func (n *notifier) subscribe(ctx context.Context, channel, owner string) *subscription {
	s := &subscription{n: n, channel: channel, c: make(chan struct{}, 1)}
	n.psMu.Lock()
	n.mu.Lock()
	cs := n.chans[channel]
	fresh := cs == nil
	if fresh {
		cs = &channelState{ready: make(chan struct{}), waiters: make(map[chan struct{}]string)}
		n.chans[channel] = cs
	}
	cs.refs++
	cs.waiters[s.c] = owner
	ready := cs.ready
	n.mu.Unlock()
	if fresh {
		_ = n.subscribeCmd(channel) // a failure shows up as a missing confirmation
	}
	n.psMu.Unlock()

	t := time.NewTimer(confirmTimeout)
	defer t.Stop()
	select {
	case <-ready:
		s.confirmed = true
	case <-ctx.Done():
	case <-n.closing:
	case <-t.C:
	}
	return s
}

func (s *subscription) close() {
	n := s.n
	n.mu.Lock()
	if cs := n.chans[s.channel]; cs != nil {
		delete(cs.waiters, s.c)
		cs.refs--
		if cs.refs == 0 {
			cs.idleSince = time.Now()
		}
	}
	n.mu.Unlock()
}

// unsubscribeIdle drops confirmed channels nobody waited on for idleChannelAfter. Hot locks
// stay subscribed, so their waiters skip the SUBSCRIBE round trip.
func (n *notifier) unsubscribeIdle() {
	n.psMu.Lock()
	defer n.psMu.Unlock()
	var idle []string
	n.mu.Lock()
	for ch, cs := range n.chans {
		if cs.refs == 0 && cs.confirmed && time.Since(cs.idleSince) > idleChannelAfter {
			idle = append(idle, ch)
			delete(n.chans, ch)
		}
	}
	n.mu.Unlock()
	if len(idle) > 0 {
		if n.sharded {
			_ = n.ps.SUnsubscribe(n.psCtx, idle...)
		} else {
			_ = n.ps.Unsubscribe(n.psCtx, idle...)
		}
	}
}

// watch makes a hold's loss detectable by push: its key is read (and so tracked) trackDelay
// after it was taken.
func (n *notifier) watch(key string, l *hold) {
	n.mu.Lock()
	set := n.watched[key]
	if set == nil {
		set = make(map[*hold]uint64)
		n.watched[key] = set
	}
	n.watchSeq++
	set[l] = n.watchSeq
	n.mu.Unlock()
	// Arm tracking a moment later (the hold's timer calls arm): most contended holds end
	// sooner and never cost a read, while a change before the read is still caught by it,
	// well within the 5 ms loss-detection goal.
	l.mu.Lock()
	ended := l.state == holdEnded
	if !ended {
		l.armAt = l.c.now().Add(trackDelay)
		l.resetTimerLocked()
	}
	l.mu.Unlock()
	if ended {
		n.unwatch(key, l)
	}
}

// arm queues a watched hold's key for its first tracked read.
func (n *notifier) arm(key string, l *hold) {
	n.mu.Lock()
	_, ok := n.watched[key][l]
	if ok {
		n.pending[key] = struct{}{}
	}
	n.mu.Unlock()
	if ok {
		n.poke()
	}
}

func (n *notifier) unwatch(key string, l *hold) {
	n.mu.Lock()
	if set := n.watched[key]; set != nil {
		delete(set, l)
		if len(set) == 0 {
			delete(n.watched, key)
			delete(n.pending, key)
		}
	}
	n.mu.Unlock()
}

// checkLoop owns the tracking connection: it turns tracking on (again after every new pub/sub
// connection), reads the keys whose state may have changed, and ends the leases they no
// longer belong to.
func (n *notifier) checkLoop() {
	defer n.wg.Done()
	var trk *redis.Conn
	var trackedEpoch uint64
	defer func() {
		if trk != nil {
			_ = trk.Close()
		}
	}()
	sweep := time.NewTicker(idleChannelAfter)
	defer sweep.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-sweep.C:
			n.unsubscribeIdle()
			continue
		case <-n.kick:
		case <-retry.C:
		}
		n.mu.Lock()
		skip := n.noTracking
		n.mu.Unlock()
		ep := n.epoch.Load()
		if skip || ep == 0 {
			continue // no pub/sub connection yet: reconnected() pokes when there is one
		}
		if trk == nil || ep != trackedEpoch {
			if trk != nil {
				_ = trk.Close()
			}
			var err error
			trk, err = n.startTracking(n.pubsubID.Load())
			if err != nil {
				trk = nil
				retry.Reset(100 * time.Millisecond)
				continue
			}
			if trk == nil {
				continue // tracking unsupported
			}
			trackedEpoch = ep
			n.mu.Lock()
			n.recheckAll = true
			n.mu.Unlock()
		}
		if err := n.check(trk); err != nil {
			_ = trk.Close()
			trk = nil
			retry.Reset(100 * time.Millisecond)
		}
	}
}

// startTracking opens the tracking connection. It returns (nil, nil) when the server does not
// support or allow CLIENT TRACKING, and an error for transient failures.
func (n *notifier) startTracking(redirect int64) (*redis.Conn, error) {
	ctx, cancel := context.WithTimeout(n.ctx, trackerTimeout)
	defer cancel()
	trk := n.nc.Conn()
	err := trk.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", redirect).Err()
	if err == nil {
		return trk, nil
	}
	_ = trk.Close()
	var rerr redis.Error
	if errors.As(err, &rerr) && !isMissingRedirect(err) {
		n.mu.Lock()
		n.noTracking = true
		n.mu.Unlock()
		return nil, nil
	}
	return nil, err
}

// isMissingRedirect reports the error CLIENT TRACKING gives when the pub/sub connection it
// should redirect to has gone; a new one is on its way.
func isMissingRedirect(err error) bool {
	return err != nil && strings.Contains(err.Error(), "redirect")
}

// check reads every pending key once on the tracking connection (one pipelined round trip)
// and ends the holds whose own field ("#" + hold id) is gone: comparing the owner alone would
// miss a delete followed by a new hold of the same owner. Only leases watched before the read was sent
// are judged: a lease acquired meanwhile may not be in what the read returned, and its own
// watch call has queued the key for the next round.
func (n *notifier) check(trk *redis.Conn) error {
	n.mu.Lock()
	judgeUpTo := n.watchSeq
	var keys []string
	if n.recheckAll {
		n.recheckAll = false
		clear(n.pending)
		for k := range n.watched {
			keys = append(keys, k)
		}
	} else {
		for k := range n.pending {
			keys = append(keys, k)
		}
		clear(n.pending)
	}
	n.mu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(n.ctx, trackerTimeout)
	defer cancel()
	cmds := make([]*redis.MapStringStringCmd, len(keys))
	_, err := trk.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.HGetAll(ctx, k)
		}
		return nil
	})
	if err != nil && !isRedisReply(err) {
		n.mu.Lock()
		for _, k := range keys {
			if _, ok := n.watched[k]; ok {
				n.pending[k] = struct{}{}
			}
		}
		n.mu.Unlock()
		return err
	}
	type loss struct {
		l     *hold
		cause error
	}
	var lost []loss
	var confirmed []*hold
	n.mu.Lock()
	for i, k := range keys {
		// A reply error (WRONGTYPE) means someone replaced the lock hash with another type.
		fields, ferr := cmds[i].Result()
		for l, seq := range n.watched[k] {
			if seq > judgeUpTo {
				continue
			}
			if _, ok := fields["#"+l.holdID]; ok && ferr == nil {
				confirmed = append(confirmed, l)
				continue
			}
			cause := errKeyGone
			if len(fields) > 0 || ferr != nil {
				cause = errTaken
			}
			lost = append(lost, loss{l, cause})
		}
	}
	n.mu.Unlock()
	for _, l := range confirmed {
		l.trackedOnce.Do(func() { close(l.tracked) })
	}
	for _, x := range lost {
		x.l.lose(x.cause)
	}
	return nil
}
