package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// errSlowMaster is the cause of ErrUnavailable for a Redlock master that did not answer
// within the node timeout.
var errSlowMaster = errors.New("no answer from the Redlock master")

// NewRedlock returns a Client whose Mutexes are held on a quorum (len(masters)/2 + 1) of
// independent Redis masters, antirez's Redlock: a lease stands while a quorum of masters
// holds the lock, so the loss of fewer than a quorum of masters (a crash, a failover that
// lost the write, a partition) never lets two owners in. The masters must be independent
// deployments (standalone servers, or Sentinel groups), not replicas of one another. Options
// are those of New and apply on every master.
//
// NewRedlock never fails itself: fewer than 3 masters, a nil master or the same server given
// twice is reported by every call as ErrInvalid. The Client serves Mutex, Inspect and
// ForceRelease; RWMutex, MultiLock, Semaphore, Latch and Locks return an error matching
// errors.ErrUnsupported. A Redlock Mutex never cohorts (WithoutCohort): every lease is its
// own hold on each master.
//
// How a lease is taken: an acquire goes to every master at once, each answer awaited at most
// a tenth of the TTL (200 ms at most); the lease is held when a quorum of masters granted it,
// each master's hold counting from its own send time (validity = TTL − elapsed − drift), and
// only when the first master that answered is among them, so waiters are served in the FIFO
// of that master (the first in the list, while it is up). A caller that gets less gives back
// what it took; Lock then waits, woken by push, in the queue of the first master that refused
// it, keeping the masters before that one (every waiter takes the masters in list order, so
// none waits for another in a cycle). Each master's hold is renewed by its watchdog and loss
// detection as a Mutex's hold is; the lease is lost once fewer than a quorum of them hold.
//
// Fencing: the lease's Token is the highest of its masters' tokens, raised on a quorum of
// masters (all of them are asked) before the lease is handed out. Any later lease's quorum
// shares a master with that one, so its token is higher, as long as that master kept its data
// (see docs/DESIGN.md for a master that restarts empty).
func NewRedlock(masters []redis.UniversalClient, opts ...Option) *Client {
	c := newClient(nil, opts)
	rl := &redlock{quorum: len(masters)/2 + 1}
	errs := []error{c.err}
	if len(masters) < 3 {
		errs = append(errs, fmt.Errorf("%w: Redlock over %d masters: it needs at least 3 (a quorum must survive the loss of one)", ErrInvalid, len(masters)))
	}
	seen := make(map[string]int)
	nodeOpts := append(slices.Clip(opts), WithoutCohort())
	for i, m := range masters {
		if isNil(m) {
			errs = append(errs, fmt.Errorf("%w: Redlock master %d is a nil Redis client", ErrInvalid, i))
			continue
		}
		id := masterID(m)
		if j, dup := seen[id]; dup {
			errs = append(errs, fmt.Errorf("%w: Redlock masters %d and %d are one server (%s): a quorum of copies is no quorum", ErrInvalid, j, i, id))
		}
		seen[id] = i
		rl.nodes = append(rl.nodes, New(m, nodeOpts...))
	}
	c.err = join(errs...)
	c.rl = rl
	return c
}

// masterID names the server a Redlock master's client talks to: its address and database,
// or the client itself where the address says nothing (a Sentinel group, a Cluster).
func masterID(m redis.UniversalClient) string {
	if r, ok := m.(*redis.Client); ok && r.Options().Addr != "FailoverClient" {
		return r.Options().Addr + "/" + strconv.Itoa(r.Options().DB)
	}
	return fmt.Sprintf("%T %p", m, m)
}

// redlock is what a NewRedlock Client holds its locks with: a Client per master, each with its
// own renewal and notification connection.
type redlock struct {
	nodes  []*Client
	quorum int

	mu        sync.Mutex
	contended map[string]bool // locks whose last acquisition had to wait (bounded, see waited)
}

// maxContended bounds redlock.contended: past it the hints start over.
const maxContended = 4096

// waited records whether the last acquisition of lock had to wait.
func (r *redlock) waited(lock string, yes bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !yes:
		delete(r.contended, lock)
	case r.contended == nil || len(r.contended) >= maxContended:
		r.contended = map[string]bool{lock: true}
	default:
		r.contended[lock] = true
	}
}

func (r *redlock) wasContended(lock string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.contended[lock]
}

// close closes every master's Client at once: their leases end with ErrClosed.
func (r *redlock) close(ctx context.Context) error {
	errs := make([]error, len(r.nodes))
	var wg sync.WaitGroup
	for i, n := range r.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.Close(ctx)
		}()
	}
	wg.Wait()
	return join(errs...)
}

// unsupported says that primitive is not served by c, when c is a Redlock's.
func (c *Client) unsupported(primitive string) error {
	if c.rl == nil {
		return nil
	}
	return fmt.Errorf("dlock: %s on a Redlock Client: %w (NewRedlock serves Mutex only)", primitive, errors.ErrUnsupported)
}

// nodeTimeout is how long a Redlock acquire waits for one master's answer: a tenth of the
// TTL, at most multiStepTimeout, so a silent master costs a small part of the lease.
func (r *redlock) nodeTimeout(ttl time.Duration) time.Duration {
	return min(ttl/10, multiStepTimeout)
}

// redlockLease takes the lock of s on a quorum of c's masters (waiting when wait is set) and
// returns its lease.
func (c *Client) redlockLease(ctx context.Context, ref lockRef, s holdSpec, wait bool, newOwner func() string) (*Lease, error) {
	hs, token, err := c.rl.take(ctx, c, s, wait, newOwner)
	if err != nil {
		return nil, err
	}
	return newQuorumHolding(hs, c.rl.quorum, token).first(ctx, ref), nil
}

// take returns holds on at least a quorum of the masters, the first master that answered
// among them, and the lease's token (see NewRedlock), or nothing and why.
func (r *redlock) take(ctx context.Context, c *Client, s holdSpec, wait bool, newOwner func() string) ([]*hold, uint64, error) {
	held := make([]*hold, len(r.nodes))
	giveBack := func(from int) {
		for i := from; i < len(held); i++ {
			if held[i] != nil {
				r.nodes[i].giveBack([]*hold{held[i]})
				held[i] = nil
			}
		}
	}
	backoff := time.Duration(0)
	ws := s
	ws.failFast = true
	granted := false // the first master was handed over by a release (it was waited for)
	if wait && r.wasContended(s.keys.lock) {
		// The lock was waited for last time (a loop of Lock calls, each right after the
		// previous lease's Unlock handed it on): queue on the first master at once. A pass
		// would take the other masters ahead of the waiter the release woke, only to give
		// them back when it finds the first master granted to that waiter.
		h, err := r.nodes[0].waitHold(ctx, ws, true)
		switch {
		case err == nil:
			held[0] = h
			granted = h.wasGranted()
		case errors.Is(err, ErrUnavailable) && ctx.Err() == nil: // the passes go on without it
		default:
			return nil, 0, err
		}
	}
	for first := true; ; first = false {
		if err := c.checkOpen(); err != nil {
			giveBack(0)
			return nil, 0, fmt.Errorf("%w: lock %q", err, s.name)
		}
		errs, slow := r.pass(ctx, s, held)
		if slow && !s.reentrant {
			// An attempt given up on may still reach its master: from now on the call is
			// another owner there, so that attempt's hold is a stranger's, given back when
			// its reply comes (tryHoldWithin). A WithOwner id stays (its holds are counted).
			s.owner = newOwner()
		}
		ticket, refused, n, answered := -1, -1, 0, 0
		var hard, unavailable []error
		for i, h := range held {
			switch err := errs[i]; {
			case h != nil && !h.valid():
				r.nodes[i].giveBack([]*hold{h}) // ended while the others were taken
				held[i] = nil
			case h != nil:
				n++
				answered++
				if ticket < 0 {
					ticket = i
				}
			case err == nil:
			case errors.Is(err, ErrNotObtained) && !errors.Is(err, errLateReply) && !errors.Is(err, errLostAtOnce):
				answered++
				if ticket < 0 {
					ticket = i
				}
				if refused < 0 {
					refused = i
				}
			case errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotObtained):
				unavailable = append(unavailable, err)
			default:
				hard = append(hard, err)
			}
		}
		if cerr := ctx.Err(); cerr != nil {
			giveBack(0)
			return nil, 0, notObtained(s.name, cerr, join(unavailable...))
		}
		if len(hard) > 0 { // ErrInvalid, ErrIncompatible, ErrClosed, a Redis error reply
			giveBack(0)
			return nil, 0, join(hard...)
		}
		if n >= r.quorum && held[ticket] != nil {
			token, err := r.raiseFence(ctx, s, held)
			if err == nil {
				if wait {
					r.waited(s.keys.lock, !first || granted)
				}
				hs := slices.DeleteFunc(slices.Clone(held), func(h *hold) bool { return h == nil })
				return hs, token, nil
			}
			giveBack(0)
			if !wait || ctx.Err() != nil || !errors.Is(err, ErrUnavailable) {
				return nil, 0, err
			}
			unavailable, refused = []error{err}, -1
		}
		if answered < r.quorum {
			refused = -1 // no quorum answered: whether it is taken is not known
		}
		if !wait {
			giveBack(0)
			if refused >= 0 {
				return nil, 0, notObtained(s.name, fmt.Errorf("master %d of %d refused it (held, or waited for); %d granted, a quorum is %d", refused, len(r.nodes), n, r.quorum))
			}
			return nil, 0, fmt.Errorf("%w: lock %q: %d of %d masters answered, a quorum is %d: %w", ErrUnavailable, s.name, answered, len(r.nodes), r.quorum, join(unavailable...))
		}
		if refused < 0 {
			// Too few masters answered: wait it out as Lock does (a master restarting).
			giveBack(0)
			backoff = min(max(2*backoff, minUnavailableRetry), maxUnavailableRetry)
			if err := sleepCtx(ctx, c, backoff/2+rand.N(backoff/2+1)); err != nil {
				return nil, 0, notObtained(s.name, err, join(unavailable...))
			}
			continue
		}
		backoff = 0
		// Wait in the queue of the first master that refused: the ticket master when another
		// owner has it (give everything back, so the ticket's holder can go on), else the
		// first one after it that refused, keeping only the masters before that one.
		j := refused
		if held[ticket] == nil {
			giveBack(0)
		} else {
			giveBack(j + 1)
		}
		h, err := r.nodes[j].waitHold(ctx, ws, true)
		switch {
		case err == nil:
			held[j] = h
		case errors.Is(err, ErrUnavailable) && ctx.Err() == nil:
			// That master went silent: the next pass goes on without it.
		default:
			giveBack(0)
			return nil, 0, err
		}
	}
}

// pass makes one acquire on every master not held yet, all at once, each awaited at most the
// node timeout, and returns each master's error (nil where held or not tried) and whether an
// attempt was given up on.
func (r *redlock) pass(ctx context.Context, s holdSpec, held []*hold) (errs []error, slow bool) {
	errs = make([]error, len(r.nodes))
	d := r.nodeTimeout(s.cfg.leaseTTL())
	var wg sync.WaitGroup
	for i, n := range r.nodes {
		if held[i] != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			held[i], errs[i] = n.tryHoldWithin(ctx, s, d, errSlowMaster)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if errors.Is(err, errSlowMaster) {
			slow = true
		}
	}
	return errs, slow
}

// raiseFence returns the lease's token, the highest of the held masters' tokens, once a quorum
// of the masters has raised the lock's fencing counter to it (all of them are asked, at once).
func (r *redlock) raiseFence(ctx context.Context, s holdSpec, held []*hold) (uint64, error) {
	var token uint64
	for _, h := range held {
		if h != nil {
			token = max(token, h.token)
		}
	}
	d := r.nodeTimeout(s.cfg.leaseTTL())
	answers := make(chan error, len(r.nodes))
	for _, n := range r.nodes {
		if !n.goBackground() {
			answers <- fmt.Errorf("%w: lock %q", ErrClosed, s.name)
			continue
		}
		go func() {
			defer n.wg.Done()
			rctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			err := scripts.FenceFloor.Run(rctx, n.rdb, []string{s.keys.fence}, strconv.FormatUint(token, 10)).Err()
			answers <- err
		}()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	var errs []error
	for ok := 0; ok < r.quorum; {
		select {
		case err := <-answers:
			if err == nil {
				ok++
				continue
			}
			if isRedisReply(err) && classify(err) != replyUnavailable {
				return 0, redisErr("raise fence", s.name, err) // NOPERM, a script error: not a fault to wait out
			}
			errs = append(errs, redisErr("raise fence", s.name, err))
			if len(errs) > len(r.nodes)-r.quorum {
				return 0, fmt.Errorf("%w: lock %q: fewer than a quorum of %d masters raised its fencing token: %w", ErrUnavailable, s.name, r.quorum, join(errs...))
			}
		case <-t.C:
			return 0, fmt.Errorf("%w: lock %q: a quorum of %d masters did not raise its fencing token within %v: %w", ErrUnavailable, s.name, r.quorum, d, join(errs...))
		}
	}
	return token, nil
}

// inspect reads the lock on every master at once (Client.Inspect).
func (r *redlock) inspect(ctx context.Context, name string) (LockInfo, error) {
	infos := make([]LockInfo, len(r.nodes))
	errs := make([]error, len(r.nodes))
	var wg sync.WaitGroup
	for i, n := range r.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], errs[i] = n.Inspect(ctx, name)
			infos[i].Name, infos[i].Master = name, r.nodeName(i)
			if errs[i] != nil {
				infos[i].Error = errs[i].Error()
			}
		}()
	}
	wg.Wait()
	info := LockInfo{Name: name, Masters: infos}
	byOwner := make(map[string][]LockInfo)
	answered := 0
	for i, m := range infos {
		if errs[i] != nil {
			continue
		}
		answered++
		info.Waiters = max(info.Waiters, m.Waiters)
		info.Foreign = info.Foreign || m.Foreign
		if m.Held && m.Owner != "" {
			byOwner[m.Owner] = append(byOwner[m.Owner], m)
		}
	}
	for owner, ms := range byOwner {
		if len(ms) < r.quorum {
			continue
		}
		ttls := make([]time.Duration, 0, len(ms))
		info.Held, info.Owner, info.HoldCount = true, owner, ms[0].HoldCount
		for _, m := range ms {
			info.Token = max(info.Token, m.Token)
			ttls = append(ttls, m.TTL)
		}
		slices.Sort(ttls)
		info.TTL = ttls[len(ttls)-r.quorum]
	}
	if answered < r.quorum {
		return info, fmt.Errorf("%w: inspect %q: %d of %d masters answered, a quorum is %d: %w", ErrUnavailable, name, answered, len(r.nodes), r.quorum, join(errs...))
	}
	return info, nil
}

// forceRelease breaks the lock on every master at once (Client.ForceRelease).
func (r *redlock) forceRelease(ctx context.Context, name string) (bool, error) {
	held := make([]bool, len(r.nodes))
	errs := make([]error, len(r.nodes))
	var wg sync.WaitGroup
	for i, n := range r.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			held[i], errs[i] = n.ForceRelease(ctx, name)
		}()
	}
	wg.Wait()
	return slices.Contains(held, true), join(errs...)
}

// nodeName names master i for people: its address, or its place in the list.
func (r *redlock) nodeName(i int) string {
	if rc, ok := r.nodes[i].rdb.(*redis.Client); ok && rc.Options().Addr != "FailoverClient" {
		return rc.Options().Addr
	}
	return "master " + strconv.Itoa(i)
}
