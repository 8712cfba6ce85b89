package dlock

import (
	"container/heap"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

const (
	maxRenewBatch   = 512                    // leases renewed in one pipelined round trip
	maxRenewRetry   = 500 * time.Millisecond // cap on the retry delay after a failed renewal
	minRenewTimeout = 10 * time.Millisecond
)

// renewer is the Client's watchdog: one goroutine that schedules every hold's renewal at
// TTL/4, batching the leases due together into one pipeline per Redis node instead of running
// a goroutine per lock. Each node's batch runs on its own short-lived goroutine, so a node that
// is slow or down delays only its own leases. A refused renewal ends the lease as lost; a
// failed one is retried until the lease's safe deadline timer (see hold.setDeadlineLocked)
// ends it.
type renewer struct {
	c    *Client
	kick chan struct{}

	mu       sync.Mutex // guards h, nextWake and every hold's heapIdx and renewAt; before hold.mu
	h        leaseHeap
	nextWake time.Time // when the loop's timer fires; a hold due later needs no wake-up
}

func newRenewer(c *Client) *renewer {
	return &renewer{c: c, kick: make(chan struct{}, 1)}
}

// renewPeriod is TTL/4: a renewal's deadline is trusted only once the next one succeeded (see
// hold.setDeadlineLocked), which leaves a lease half its TTL of slack for retries.
func renewPeriod(ttl time.Duration) time.Duration { return max(ttl/4, minRenewPeriod) }

func (r *renewer) add(l *hold, sent time.Time) {
	r.mu.Lock()
	l.mu.Lock()
	wake := false
	if l.state == holdHeld && l.heapIdx < 0 {
		l.renewAt = sent.Add(firstRenewal(l))
		heap.Push(&r.h, l)
		wake = l.renewAt.Before(r.nextWake)
	}
	l.mu.Unlock()
	r.mu.Unlock()
	if wake {
		r.poke()
	}
}

// firstRenewal is how long after its acquire was sent a hold is first renewed: TTL/4, or for a
// hold a release granted, within the grant's TTL (half of it), which it holds only until then.
func firstRenewal(l *hold) time.Duration {
	if l.grantTTL > 0 {
		return min(renewPeriod(l.ttl), l.grantTTL/2)
	}
	return renewPeriod(l.ttl)
}

// reschedule moves a scheduled lease's next renewal to TTL/4 after sent.
func (r *renewer) reschedule(l *hold, sent time.Time) {
	r.mu.Lock()
	if l.heapIdx >= 0 {
		l.mu.Lock()
		l.renewAt = sent.Add(renewPeriod(l.ttl))
		l.mu.Unlock()
		heap.Fix(&r.h, l.heapIdx)
	}
	r.mu.Unlock()
	r.poke()
}

func (r *renewer) remove(l *hold) {
	r.mu.Lock()
	if l.heapIdx >= 0 {
		heap.Remove(&r.h, l.heapIdx)
	}
	r.mu.Unlock()
}

func (r *renewer) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *renewer) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		wait := time.Hour
		if len(r.h) > 0 {
			wait = r.c.until(r.h[0].renewAt)
		}
		r.nextWake = r.c.now().Add(wait)
		r.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
			continue
		case <-timer.C:
		}
		for _, batch := range byNode(r.popDue()) {
			if !r.c.goBackground() {
				return
			}
			go func() {
				defer r.c.wg.Done()
				r.renewBatch(ctx, batch)
			}()
		}
	}
}

func (r *renewer) popDue() []*hold {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.c.now()
	var due []*hold
	for len(r.h) > 0 && !r.h[0].renewAt.After(now) && len(due) < maxRenewBatch {
		due = append(due, heap.Pop(&r.h).(*hold))
	}
	return due
}

// byNode splits holds by the notifier of their node (one per Redis node; nil when the client
// type has none, which puts them together), and granted holds' first renewals (hold.grantTTL)
// from the others: they have a fraction of a TTL left, so their batch gets a short timeout
// and retries soon, which the others need not share.
func byNode(due []*hold) [][]*hold {
	if len(due) == 0 {
		return nil
	}
	// Holds with different replica acknowledgement settings never share a batch: a WAITAOF
	// answer does not count replicas without an AOF, which a WAIT hold needs counted.
	type batchKey struct {
		n       *notifier
		granted bool
		ack     replicaAck
	}
	groups := make(map[batchKey][]*hold)
	var order []batchKey
	for _, h := range due {
		h.mu.Lock()
		k := batchKey{h.notif, h.grantTTL > 0, h.cfg.ack}
		h.mu.Unlock()
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], h)
	}
	out := make([][]*hold, 0, len(order))
	for _, n := range order {
		out = append(out, groups[n])
	}
	return out
}

// renewBatch extends every lease in due (all on one node) with one pipelined round trip.
func (r *renewer) renewBatch(ctx context.Context, due []*hold) {
	ttls := make([]time.Duration, len(due))
	retries := make([]time.Duration, len(due)) // when to try again after a failure
	timeout := time.Duration(1<<63 - 1)
	for i, l := range due {
		l.mu.Lock()
		ttls[i] = l.ttl
		window := l.liveTTL() // short for a granted hold's first renewal
		l.mu.Unlock()
		retries[i] = min(window/10, maxRenewRetry)
		timeout = min(timeout, max(window/4, minRenewTimeout))
	}
	// Under WithReplicaAck the batch goes to the node's own client, with the ack write and WAIT
	// (or WAITAOF) on the same connection (replicaack.go); its holds share one setting (byNode).
	ack := due[0].cfg.ack
	ctx, cancel := context.WithTimeout(ctx, timeout+ack.timeout)
	defer cancel()
	var rdb redis.Cmdable = r.c.rdb
	var wait *redis.Cmd
	if ack.on() {
		node, err := r.c.ackNode(ctx, due[0].keys.lock)
		if err != nil {
			observe := r.c.observesRenewals() && r.c.checkOpen() == nil
			for i, l := range due {
				if observe {
					r.c.observeRenewal(l, 0, redisErr("renew", l.name, err))
				}
				r.requeue(l, r.c.now().Add(retries[i]), time.Time{}, 0)
			}
			return
		}
		rdb = node
	}
	sent := r.c.now()
	began := time.Now()
	var cmds []*redis.Cmd
	if !ack.on() {
		keys, args := make([][]string, len(due)), make([][]any, len(due))
		for i, l := range due {
			keys[i], args[i] = []string{l.keys.lock}, []any{l.holdID, ttls[i].Milliseconds()}
		}
		cmds = r.c.runBatch(ctx, scripts.Extend, keys, args) // NOSCRIPT already answered by EVAL
	} else {
		pipe := rdb.Pipeline()
		cmds = make([]*redis.Cmd, len(due))
		for i, l := range due {
			cmds[i] = scripts.Extend.EvalSha(ctx, pipe, []string{l.keys.lock}, l.holdID, ttls[i].Milliseconds())
		}
		if ack.on() {
			wait = ack.send(ctx, pipe, due[0].keys.lock)
		}
		_, _ = pipe.Exec(ctx)
	}
	rtt := time.Since(began)
	// Renewals cut short by Close are not news.
	observe := r.c.observesRenewals() && r.c.checkOpen() == nil

	cached := false
	for i, l := range due {
		n, err := cmds[i].Int()
		if err != nil && ack.on() && !cached && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			// A fallback call would be on another connection, where WAIT proves nothing:
			// cache the script (once per batch, through an acked Extend of this hold, whose
			// outcome is not used) and renew again soon.
			cached = true
			_, _ = r.c.runAcked(ctx, ack, scripts.Extend, []string{l.keys.lock}, l.holdID, ttls[i].Milliseconds())
		}
		if a := l.cfg.ack; err == nil && n != 0 && a.on() {
			if rep := ack.read(wait); a.short(rep) {
				// Renewed in Redis but not acknowledged: it does not count. The lease keeps
				// its deadline, and the next try comes soon (a renewal that is acknowledged
				// counts from when it was sent).
				if observe {
					r.c.observeRenewal(l, rtt, join(fmt.Errorf("%w: lock %q: renewal acknowledged by %d of %d replicas", ErrNotReplicated, l.name, rep.replicas, a.n), rep.err))
				}
				r.requeue(l, r.c.now().Add(retries[i]), time.Time{}, 0)
				continue
			}
		}
		switch {
		case err != nil:
			if observe {
				r.c.observeRenewal(l, rtt, redisErr("renew", l.name, err))
			}
			if classify(err) == replyUnavailable {
				// A dead Cluster master answers nothing, not MOVED: ask the client to look for
				// the slot's new master, or renewals would go to the dead node until the deadline.
				r.c.topologyMayHaveChanged(ctx)
			}
			r.requeue(l, r.c.now().Add(retries[i]), time.Time{}, 0)
		case n == 0:
			// Unless the hold was released meanwhile (an Unlock overtook the renewal): then the
			// refusal is no loss, and not news.
			if l.lose(errRenewRefused) && observe {
				r.c.observeRenewal(l, rtt, leaseLost(l.name, errRenewRefused))
			}
		default:
			if observe {
				r.c.observeRenewal(l, rtt, nil)
			}
			r.requeue(l, sent.Add(renewPeriod(ttls[i])), sent, ttls[i])
		}
	}
}

// requeue schedules a hold's next renewal if it is still held; a non-zero renewed moves its
// safe deadline to renewed + ttl × (1 − drift), ttl being what that renewal sent.
func (r *renewer) requeue(l *hold, at, renewed time.Time, ttl time.Duration) {
	r.mu.Lock()
	l.mu.Lock()
	if l.state == holdHeld && l.heapIdx < 0 {
		if !renewed.IsZero() {
			// A granted hold's first renewal counts at once, as the acquire it stands for
			// would have: until then the hold had only the grant's short TTL.
			l.setDeadlineLocked(renewed, ttl, l.grantTTL == 0)
			l.grantTTL = 0
		}
		l.renewAt = at
		heap.Push(&r.h, l)
	}
	l.mu.Unlock()
	r.mu.Unlock()
	r.poke()
}

// leaseHeap orders leases by their next renewal time.
type leaseHeap []*hold

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].renewAt.Before(h[j].renewAt) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*hold)
	l.heapIdx = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.heapIdx = -1
	return l
}
