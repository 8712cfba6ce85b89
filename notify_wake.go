package dlock

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// The waking half of the notifier: release channels and the waiters subscribed to them.

type channelState struct {
	refs      int
	confirmed bool
	lapsed    bool                     // was confirmed on a connection since replaced: its waiters wake on the new confirmation
	ready     chan struct{}            // closed when SUBSCRIBE is confirmed
	waiters   map[*subscription]string // the waiters, with their owner ids
	idleSince time.Time
	sentAt    time.Time // when SUBSCRIBE was last sent for it (n.mu)
}

func wakeAll(cs *channelState) { wake(cs, "") }

// wake wakes the waiters of owner, or all waiters when owner is "".
func wake(cs *channelState, owner string) {
	wakeGranted(cs, owner, nil)
}

// wakeGranted wakes the waiters of owner (all waiters when owner is ""), handing each the
// grant g, if not nil, that a release made to it (called under n.mu).
func wakeGranted(cs *channelState, owner string, g *grantMsg) {
	for s, o := range cs.waiters {
		if owner != "" && o != owner {
			continue
		}
		if g != nil {
			s.grant = g
		}
		select {
		case s.c <- struct{}{}:
		default:
		}
	}
}

// A grantMsg is a grant that wrote a waiter's recorded hold ("G <holdId> <attempt> <grant
// TTL ms> <token> <waiting> <owner>", lib.lua): the waiter holds the lock as of the message.
type grantMsg struct {
	holdID  string
	attempt uint64        // the waiter's attempt that recorded the hold (holdSpec.attempt)
	ttl     time.Duration // the TTL the grant gave the lock
	token   uint64
	waiting bool // others still wait in the queue behind the readers granted
}

// parseGrant parses the payload of a "G" message into its grant and owner; ok is false for
// any other payload.
func parseGrant(payload string) (g *grantMsg, owner string, ok bool) {
	f := strings.SplitN(payload, " ", 7)
	if len(f) != 7 || f[0] != "G" || f[1] == "" || f[6] == "" || (f[5] != "0" && f[5] != "1") {
		return nil, "", false
	}
	attempt, err1 := strconv.ParseUint(f[2], 10, 64)
	ttl, err2 := strconv.ParseInt(f[3], 10, 64)
	token, err3 := strconv.ParseUint(f[4], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || ttl <= 0 {
		return nil, "", false
	}
	return &grantMsg{holdID: f[1], attempt: attempt, ttl: time.Duration(ttl) * time.Millisecond,
		token: token, waiting: f[5] == "1"}, f[6], true
}

// writerWaits is the owner under which a Client's shared read holds listen on a lock's
// channel (no owner id starts with '#'): the "x" message, a writer joining the queue, wakes them
// alone.
const writerWaits = "#x"

// released handles a message on a lock's channel. "G ...": a release granted the lock to a
// waiter with the hold it recorded, handed to that waiter; "g <owner>": a release granted the
// lock to owner, to confirm; "w <owner>": it freed the lock for owner, first in line, to
// compete for; either way only that waiter wakes. "x": a writer joined the queue, which wakes
// the shared read holds (readshare.go). "z <generation>": a latch opened (its waiters that read
// that generation's count return at once).
// Anything else wakes every waiter.
func (n *notifier) released(channel, payload string) {
	owner := ""
	g, gOwner, granted := parseGrant(payload)
	gen, opened := latchOpened(payload)
	switch {
	case opened:
	case granted:
		owner = gOwner
	case len(payload) > 2 && payload[1] == ' ':
		owner = payload[2:]
	case payload == "x":
		owner = writerWaits
	}
	n.mu.Lock()
	if cs := n.chans[channel]; cs != nil {
		if opened {
			// A latch opened (latch_down.lua): its waiters that read this count return
			// without reading it again.
			for s := range cs.waiters {
				s.opened = append(s.opened, gen)
			}
		}
		wakeGranted(cs, owner, g)
	}
	n.mu.Unlock()
}

// dropped handles a subscription the server ended by itself: a Cluster node unsubscribes a
// shard channel when its slot moves away (a failover, a migration). Its waiters wake and
// retry at once; the retry reaches the slot's new master and subscribes there.
func (n *notifier) dropped(channel string) {
	n.mu.Lock()
	cs := n.chans[channel]
	if cs == nil || !cs.confirmed {
		n.mu.Unlock()
		return // our own SUNSUBSCRIBE of an idle channel, or one not subscribed yet
	}
	// Detached: its subscriptions close on it, and a later waiter here subscribes afresh
	// (the slot may come back, a failback).
	delete(n.chans, channel)
	wakeAll(cs)
	n.mu.Unlock()
	// go-redis keeps the channel in its list, which it subscribes again after every reconnect:
	// take it out, unless a waiter subscribed it afresh meanwhile (psMu orders the two).
	n.psMu.Lock()
	defer n.psMu.Unlock()
	n.mu.Lock()
	again := n.chans[channel] != nil
	n.mu.Unlock()
	if !again {
		_ = n.ps.SUnsubscribe(n.psCtx, channel) // the node may answer MOVED: it is not ours any more
	}
}

func (n *notifier) confirm(channel string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cs := n.chans[channel]; cs != nil && !cs.confirmed {
		cs.confirmed = true
		close(cs.ready)
		if cs.lapsed {
			// Subscribed again on a new connection: a release between the waiters' last
			// attempt and now was not heard, so they attempt once more.
			cs.lapsed = false
			wakeAll(cs)
		}
	}
}

// shardSubscribe sends SSUBSCRIBE (or SUNSUBSCRIBE, when !on) for chans, one command per hash
// slot: a Cluster node refuses one that names channels of two slots (CROSSSLOT), leaving every
// channel of it as it was. The caller holds psMu.
func (n *notifier) shardSubscribe(on bool, chans []string) {
	bySlot := make(map[int][]string)
	for _, ch := range chans {
		s := keySlot(ch)
		bySlot[s] = append(bySlot[s], ch)
	}
	for _, group := range bySlot {
		if on {
			_ = n.ps.SSubscribe(n.psCtx, group...) // a failure shows up as a missing confirmation
		} else {
			_ = n.ps.SUnsubscribe(n.psCtx, group...)
		}
	}
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
	cs        *channelState // nil when nothing was subscribed (no pub/sub, a retired notifier)
	c         chan struct{}
	confirmed bool      // false: the channel may not be subscribed, so the waiter must poll
	grant     *grantMsg // the latest grant pushed to the waiter (n.mu); see takeGrant
	opened    []string  // generations of a latch whose "z" came while subscribed (n.mu); see openedAny
}

// latchOpened parses a latch's opening, "z <generation>" ("z" from a latch set without one):
// the generation is the id of the TrySetCount call that set the count which reached zero.
func latchOpened(payload string) (gen string, ok bool) {
	if payload == "z" {
		return "", true
	}
	gen, ok = strings.CutPrefix(payload, "z ")
	return gen, ok
}

// openedAny reports whether the opening of a latch's count of one of the generations in seen
// (those the waiter read above zero) was pushed to the waiter. Openings of other generations
// are kept: the waiter's read of that count may be on its way still (the push can overtake
// it); an opening of a count it never reads (one from before it began, or one it could not
// read while Redis gave no answer) tells nothing of the count it reads, and is ignored.
func (s *subscription) openedAny(seen map[string]bool) bool {
	if s.cs == nil || len(seen) == 0 {
		return false
	}
	s.n.mu.Lock()
	defer s.n.mu.Unlock()
	for _, g := range s.opened {
		if seen[g] {
			return true
		}
	}
	return false
}

// takeGrant returns, and forgets, the latest grant pushed to the waiter since the last call.
func (s *subscription) takeGrant() *grantMsg {
	if s.cs == nil {
		return nil
	}
	s.n.mu.Lock()
	defer s.n.mu.Unlock()
	g := s.grant
	s.grant = nil
	return g
}

// subscribe registers a waiter on channel and returns once Redis confirmed the subscription
// (or after confirmTimeout, when ctx ends, the Client closes or subscriptions are refused,
// with confirmed false), so a release published after this returns is never missed while the
// connection stays up.
func (n *notifier) subscribe(ctx context.Context, channel, owner string) *subscription {
	s := &subscription{n: n, channel: channel, c: make(chan struct{}, 1)}
	n.psMu.Lock()
	n.mu.Lock()
	if n.noPubSub || n.retired {
		n.mu.Unlock()
		n.psMu.Unlock()
		return s
	}
	cs := n.chans[channel]
	fresh := cs == nil
	if fresh {
		cs = &channelState{ready: make(chan struct{}), waiters: make(map[*subscription]string)}
		n.chans[channel] = cs
	}
	// Sent before and still not confirmed long after: the server refused it (a Cluster node
	// not serving the slot yet answers MOVED, which leaves the connection as it is: a failback
	// brings the slot back to this node) or the command was lost, so send it again rather
	// than leave every later waiter polling.
	send := fresh || (!cs.confirmed && time.Since(cs.sentAt) > confirmTimeout)
	if send {
		cs.sentAt = time.Now()
	}
	cs.refs++
	cs.waiters[s] = owner
	s.cs = cs
	ready, denied := cs.ready, n.denied
	n.mu.Unlock()
	if send {
		if n.sharded {
			_ = n.ps.SSubscribe(n.psCtx, channel) // a failure shows up as a missing confirmation
		} else {
			_ = n.ps.Subscribe(n.psCtx, channel)
		}
	}
	n.psMu.Unlock()

	t := time.NewTimer(confirmTimeout)
	defer t.Stop()
	select {
	case <-ready:
		s.confirmed = true
	case <-denied:
	case <-ctx.Done():
	case <-n.closing:
	case <-t.C:
	}
	return s
}

// live reports whether the subscription's channel is still subscribed on its notifier (or
// being subscribed): false once the server dropped it (a slot that moved) or it never was.
func (s *subscription) live() bool {
	if s.cs == nil {
		return false
	}
	s.n.mu.Lock()
	defer s.n.mu.Unlock()
	return s.n.chans[s.channel] == s.cs
}

// gone reports whether the server dropped the subscription's channel (a Cluster slot that
// moved away from the node): false for one that is live, and for one never made (no pub/sub,
// a retired notifier), which the waiter polls for instead.
func (s *subscription) gone() bool {
	return s.cs != nil && !s.live()
}

func (s *subscription) close() {
	n := s.n
	n.mu.Lock()
	if cs := s.cs; cs != nil {
		delete(cs.waiters, s)
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
			n.shardSubscribe(false, idle)
		} else {
			_ = n.ps.Unsubscribe(n.psCtx, idle...)
		}
	}
}
