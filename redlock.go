package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
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
// twice is reported by every call as ErrInvalid. The same server under two addresses
// (localhost and 127.0.0.1) is found by the servers' run ids, asked in the background at once
// (a lock call waits for that answer, one second at most, the first time); from then on every
// lock call returns ErrInvalid. The Client serves Mutex, Inspect and
// ForceRelease; RWMutex, MultiLock, Semaphore, Latch and Locks return an error matching
// errors.ErrUnsupported. A Redlock Mutex cohorts as a Mutex of New does (unless
// WithoutCohort or WithOwner): the Client's goroutines pass one quorum of holds among
// themselves, a bounded batch at a time, each with the next token of the lease's block.
//
// How a lease is taken: an acquire goes to every master at once, each answer awaited at most
// a tenth of the TTL (200 ms at most; plus the acknowledgement's timeout under WithReplicaAck),
// so a TTL needs room for a master's round trip in a tenth of it (a master slower than that
// counts as down for the attempt: ErrUnavailable, "no answer from the Redlock master"); the lease is held when a quorum of masters granted it,
// each master's hold counting from its own send time (validity = TTL − elapsed − drift), and
// only when the first master that answered is among them, so waiters are served in the FIFO
// of that master (the first in the list, while it is up). A caller that gets less gives back
// what it took; Lock then waits, woken by push, in the queue of the first master that refused
// it, keeping the masters before that one (every waiter takes the masters in list order, so
// none waits for another in a cycle). Each master's hold is renewed by its watchdog and loss
// detection as a Mutex's hold is; the lease is lost once fewer than a quorum of them hold.
//
// Fencing: the lease's Token is the highest of its masters' tokens; before the lease is
// handed out every master it holds (a quorum at least) is raised to the last token of its
// block (a cohort's holders take the next ones). Any later lease's quorum shares a master
// with that one, so its token is higher, as long as that master kept its data (see
// docs/DESIGN.md for a master that restarts empty).
func NewRedlock(masters []redis.UniversalClient, opts ...Option) *Client {
	c := newClient(nil, opts)
	rl := &redlock{quorum: len(masters)/2 + 1}
	errs := []error{c.err}
	if len(masters) < 3 {
		errs = append(errs, fmt.Errorf("%w: Redlock over %d masters: it needs at least 3 (a quorum must survive the loss of one)", ErrInvalid, len(masters)))
	}
	if c.cfg.runnerSet {
		// One runner would send every master's scripts to the one deployment it reaches.
		errs = append(errs, fmt.Errorf("%w: WithScriptRunner is not supported by a Redlock (one runner would send every master's scripts to one deployment): its masters run theirs on go-redis", ErrInvalid))
	}
	seen := make(map[string]int)
	nodeOpts := append(slices.Clip(opts), WithoutCohort(), withoutScriptRunner())
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
	rl.checked = make(chan struct{})
	if c.err == nil && c.goBackground() {
		go func() {
			defer c.wg.Done()
			rl.checkDistinct(c.bg, masters)
		}()
	} else {
		close(rl.checked)
	}
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

	checked     chan struct{} // closed once checkDistinct has run
	distinctErr error         // two masters that are one server, found by their run ids

	mu        sync.Mutex
	contended map[string]bool // locks whose last acquisition had to wait (bounded, see waited)
}

// distinctTimeout bounds the check that the masters are distinct servers.
const distinctTimeout = time.Second

// checkDistinct asks every master for its server's run id (started by NewRedlock, in the
// background) and records ErrInvalid if two masters are one server under two addresses
// (localhost and 127.0.0.1, a DNS alias): NewRedlock can compare only the addresses. Each
// master is asked through a client of its own whose calls end with their context (the
// user's may read for its whole ReadTimeout, or without end); a master that does not answer
// within distinctTimeout, or is not a plain *redis.Client (a Sentinel or Cluster client), is
// left out of the check. It returns within distinctTimeout, or at once when the Client
// closes.
func (r *redlock) checkDistinct(bg context.Context, masters []redis.UniversalClient) {
	defer close(r.checked)
	ctx, cancel := context.WithTimeout(bg, distinctTimeout)
	defer cancel()
	ids := make([]string, len(masters))
	var wg sync.WaitGroup
	for i, m := range masters {
		rc, ok := m.(*redis.Client)
		if !ok || rc.Options().Addr == "FailoverClient" {
			continue
		}
		opt := *rc.Options()
		opt.ContextTimeoutEnabled, opt.MaxRetries = true, -1
		opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.MaxActiveConns = 1, 0, 1, 0
		opt.ClientSideCache, opt.ClientSideCacheConfig = nil, nil
		opt.AutoPipelineOptions, opt.PushNotificationProcessor, opt.MaintNotificationsConfig = nil, nil, nil
		opt.Limiter = nil
		probe := redis.NewClient(&opt)
		stop := context.AfterFunc(ctx, func() { _ = probe.Close() }) // ends a read at once on Close
		wg.Go(func() {
			defer stop()
			defer probe.Close()
			if info, err := probe.Info(ctx, "server").Result(); err == nil {
				ids[i] = infoValue(info, "run_id")
			}
		})
	}
	wg.Wait()
	seen := make(map[string]int)
	for i, id := range ids {
		if id == "" {
			continue
		}
		if j, dup := seen[id]; dup {
			r.distinctErr = fmt.Errorf("%w: Redlock masters %d and %d are one server (run_id %s): a quorum of copies is no quorum", ErrInvalid, j, i, id)
			return
		}
		seen[id] = i
	}
}

// distinct waits for checkDistinct (at most distinctTimeout, once per Client) and returns its
// verdict, or why the caller stopped waiting.
func (r *redlock) distinct(ctx context.Context, c *Client, name string) error {
	select {
	case <-r.checked:
		if r.distinctErr != nil {
			return fmt.Errorf("lock %q: %w", name, r.distinctErr)
		}
		return nil
	case <-ctx.Done():
		return notObtained(name, ctx.Err())
	case <-c.bg.Done():
		return fmt.Errorf("%w: lock %q", ErrClosed, name)
	}
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

// each runs f on every master at once and returns when all have returned.
func (r *redlock) each(f func(i int, n *Client)) {
	var wg sync.WaitGroup
	for i, n := range r.nodes {
		wg.Go(func() { f(i, n) })
	}
	wg.Wait()
}

// close closes every master's Client at once: their leases end with ErrClosed.
func (r *redlock) close(ctx context.Context) error {
	errs := make([]error, len(r.nodes))
	r.each(func(i int, n *Client) { errs[i] = n.Close(ctx) })
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
func (c *Client) redlockLease(ctx context.Context, ref lockRef, s holdSpec, wait bool) (*Lease, error) {
	hs, token, err := c.rl.take(ctx, c, s, wait, 1)
	if err != nil {
		return nil, err
	}
	hd := newQuorumHolding(hs, c.rl.quorum, token)
	hd.owner = s.owner
	return hd.first(ctx, ref), nil
}

// A redlockTake is one Lock or TryLock call's holds on the masters (nil where none), and the
// owner id it has on each: the call's, or that id in a later epoch (epochOwner) on a master
// where an attempt was given up on and may still land.
type redlockTake struct {
	r      *redlock
	s      holdSpec
	block  uint64 // how many tokens from the lease's the lease hands out (a cohort's: cohortBlock)
	held   []*hold
	owners []string
	epoch  uint64
}

// spec is the call's hold spec on master i.
func (t *redlockTake) spec(i int) holdSpec {
	s := t.s
	s.owner = t.owners[i]
	return s
}

// valid is how many of the call's holds are still valid (held, before their safe deadline).
func (t *redlockTake) valid() int {
	n := 0
	for _, h := range t.held {
		if h != nil && h.valid() {
			n++
		}
	}
	return n
}

// giveBack gives back the holds on masters from on (see drop).
func (t *redlockTake) giveBack(from int) {
	for i := from; i < len(t.held); i++ {
		t.drop(i)
	}
}

// drop gives back the hold on master i, if any, in the background: nothing waits for a silent
// master. A later attempt of the call on the same master finds the old hold its own and takes
// it over (acquire.lua), so the release, landing late, drops nothing of its.
func (t *redlockTake) drop(i int) {
	h := t.held[i]
	if h == nil {
		return
	}
	t.held[i] = nil
	n := t.r.nodes[i]
	if !n.goBackground() {
		return // Close releases it
	}
	go func() {
		defer n.wg.Done()
		n.giveBack([]*hold{h})
	}()
}

// take returns holds on at least a quorum of the masters, the first master that answered
// among them, and the lease's token T (see NewRedlock), or nothing and why. Tokens T to
// T+block-1 are below every later lease's: a lease handed from holder to holder in a cohort
// gives each holder the next one.
func (r *redlock) take(ctx context.Context, c *Client, s holdSpec, wait bool, block uint64) ([]*hold, uint64, error) {
	if err := r.distinct(ctx, c, s.name); err != nil {
		return nil, 0, err
	}
	t := &redlockTake{r: r, s: s, block: max(block, 1), held: make([]*hold, len(r.nodes)), owners: make([]string, len(r.nodes))}
	for i := range t.owners {
		t.owners[i] = s.owner
	}
	held := t.held
	backoff := time.Duration(0)
	granted := false // the first master was handed over by a release (it was waited for)
	if wait && r.wasContended(s.keys.lock) {
		// The lock was waited for last time (a loop of Lock calls, each right after the
		// previous lease's Unlock handed it on): queue on the first master at once. A pass
		// would take the other masters ahead of the waiter the release woke, only to give
		// them back when it finds the first master granted to that waiter.
		h, err := r.nodes[0].waitHold(ctx, t.waitSpec(0), true)
		switch {
		case err == nil:
			held[0] = h
			granted = h.wasGranted()
		case masterFault(ctx, err): // the passes go on without it
		default:
			return nil, 0, err
		}
	}
	for first := true; ; first = false {
		if err := c.checkOpen(); err != nil {
			t.giveBack(0)
			return nil, 0, fmt.Errorf("%w: lock %q", err, s.name)
		}
		errs := t.pass(ctx)
		ticket, refused, n, answered := -1, -1, 0, 0
		var hard, faults, unavailable []error
		for i, h := range held {
			switch err := errs[i]; {
			case h != nil && !h.valid():
				// Ended while the others were taken: it answered, and is waited for again.
				t.drop(i)
				fallthrough
			case errors.Is(err, ErrNotObtained) && !errors.Is(err, errLateReply) && !errors.Is(err, errLostAtOnce):
				answered++
				if ticket < 0 {
					ticket = i
				}
				if refused < 0 {
					refused = i
				}
			case h != nil:
				n++
				answered++
				if ticket < 0 {
					ticket = i
				}
			case err == nil:
			case errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotObtained):
				unavailable = append(unavailable, err)
			case errors.Is(err, ErrInvalid) && !errors.Is(err, ErrIncompatible):
				hard = append(hard, err) // the caller's arguments or its clients' settings (ReadTimeout, client type), not a master's fault
			default:
				// A master's own fault (OOM, NOPERM, another version's key): it counts as a
				// master down, unless too many have one for a quorum to be had.
				faults = append(faults, err)
			}
		}
		if cerr := ctx.Err(); cerr != nil {
			t.giveBack(0)
			return nil, 0, notObtained(s.name, cerr, join(unavailable...))
		}
		if len(faults) > len(r.nodes)-r.quorum {
			hard = append(hard, faults...)
		}
		if len(hard) > 0 {
			t.giveBack(0)
			return nil, 0, join(hard...)
		}
		unavailable = append(unavailable, faults...)
		if n >= r.quorum && held[ticket] != nil {
			token, err := t.raiseFence(ctx)
			if err == nil && t.valid() < r.quorum {
				// Holds ended while the fence was raised (a key deleted, a master restarted
				// empty, a deadline passed): no lease is handed out, as for a single hold lost
				// the moment it was taken.
				err = notObtained(s.name, errLostAtOnce)
			}
			if err == nil {
				if wait {
					r.waited(s.keys.lock, !first || granted)
				}
				hs := slices.DeleteFunc(slices.Clone(held), func(h *hold) bool { return h == nil })
				return hs, token, nil
			}
			t.giveBack(0)
			if cerr := ctx.Err(); cerr != nil {
				return nil, 0, notObtained(s.name, cerr, err)
			}
			if !wait || !errors.Is(err, ErrUnavailable) && !errors.Is(err, errLostAtOnce) {
				return nil, 0, err
			}
			unavailable, refused = []error{err}, -1
		}
		if answered < r.quorum {
			refused = -1 // no quorum answered: whether it is taken is not known
		}
		if !wait {
			t.giveBack(0)
			if refused >= 0 {
				return nil, 0, notObtained(s.name, fmt.Errorf("master %d of %d refused it (held, or waited for); %d granted, a quorum is %d", refused, len(r.nodes), n, r.quorum))
			}
			return nil, 0, fmt.Errorf("%w: lock %q: %d of %d masters answered, a quorum is %d: %w", ErrUnavailable, s.name, answered, len(r.nodes), r.quorum, join(unavailable...))
		}
		if refused < 0 {
			// Too few masters answered: wait it out as Lock does (a master restarting).
			t.giveBack(0)
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
			t.giveBack(0)
		} else {
			t.giveBack(j + 1)
		}
		h, err := r.nodes[j].waitHold(ctx, t.waitSpec(j), true)
		switch {
		case err == nil:
			held[j] = h
		case masterFault(ctx, err):
			// That master went silent or faulty: the next pass goes on without it.
		default:
			t.giveBack(0)
			return nil, 0, err
		}
	}
}

// masterFault reports whether err, from a wait on one master, is that master's alone (silent,
// out of memory, refusing the user, its go-redis client closed): the call goes on with the
// others (so is a setting that master's server cannot serve: ErrIncompatible). The caller's ctx
// ending, a bad argument and the Redlock Client closing are not.
func masterFault(ctx context.Context, err error) bool {
	return ctx.Err() == nil && (!errors.Is(err, ErrInvalid) || errors.Is(err, ErrIncompatible)) && !errors.Is(err, ErrNotObtained) &&
		(!errors.Is(err, ErrClosed) || errors.Is(err, redis.ErrClosed))
}

// waitSpec is the call's spec for a wait in master i's queue, which ends when the master
// stops answering (the passes go on without it).
func (t *redlockTake) waitSpec(i int) holdSpec {
	s := t.spec(i)
	s.failFast = true
	return s
}

// pass makes one acquire on every master not held yet, all at once, each awaited at most the
// node timeout, and returns each master's error (nil where held or not tried). A master whose
// attempt was given up on gets a new owner id of the call (see redlockTake).
func (t *redlockTake) pass(ctx context.Context) []error {
	errs := make([]error, len(t.r.nodes))
	d := t.r.nodeTimeout(t.s.cfg.leaseTTL())
	if a := t.s.cfg.ack; a.on() {
		d += a.timeout // the replicas' acknowledgement (WAIT) is part of a master's answer
	}
	held := slices.Clone(t.held) // read by f while it writes t.held
	t.r.each(func(i int, n *Client) {
		if held[i] == nil {
			t.held[i], errs[i] = n.tryHoldWithin(ctx, t.spec(i), d, errSlowMaster)
		}
	})
	for i, err := range errs {
		if errors.Is(err, errSlowMaster) && !t.s.reentrant { // a WithOwner id stays: its holds are counted
			t.epoch++
			t.owners[i] = epochOwner(t.s.owner, t.epoch)
		}
	}
	return errs
}

// raiseFence returns the lease's token T, the highest of the held masters' tokens, once the
// fencing counter of every held master is at least T+block-1, the last token the lease hands
// out: a master whose own block reaches that far has it already (its acquire reserved the
// block), the others are raised (fence_floor.lua), at once. A held master that does not confirm the raise in time is given
// back; an error says fewer than a quorum are left.
//
// Why every held master: a later lease's holds on masters this lease held were all taken
// after this lease let them go, so after the raise; and its quorum shares at least one master
// with this lease's. A WithOwner call may instead re-enter holds an earlier lease of the same
// owner left (acquire.lua returns their old tokens): its T is first raised to the held
// masters' counters, which that lease raised to its own T.
func (t *redlockTake) raiseFence(ctx context.Context) (uint64, error) {
	var token uint64
	var all []int
	for i, h := range t.held {
		if h != nil {
			token = max(token, h.token)
			all = append(all, i)
		}
	}
	var errs []error
	if t.s.reentrant {
		vals, rerrs := t.onMasters(ctx, all, "reading its fencing counter", func(ctx context.Context, n *Client) (uint64, error) {
			v, err := n.rdb.Get(ctx, t.s.keys.fence).Uint64()
			if errors.Is(err, redis.Nil) {
				return 0, nil
			}
			return v, err
		})
		errs = append(errs, rerrs...)
		for i, v := range vals {
			if t.held[i] != nil {
				token = max(token, v)
			}
		}
	}
	last := token + t.block - 1
	var low []int
	for i, h := range t.held {
		if h != nil && h.token+cohortBlock-1 < last {
			low = append(low, i)
		}
	}
	_, rerrs := t.onMasters(ctx, low, "raising its fencing token", func(ctx context.Context, n *Client) (uint64, error) {
		return 0, scripts.FenceFloor.Run(ctx, n.rdb, []string{t.s.keys.fence}, strconv.FormatUint(last, 10), opLogTTL.Milliseconds()).Err()
	})
	errs = append(errs, rerrs...)
	n := 0
	for _, h := range t.held {
		if h != nil {
			n++
		}
	}
	if n < t.r.quorum {
		return 0, fmt.Errorf("%w: lock %q: %d held masters confirmed its fencing token, a quorum is %d: %w", ErrUnavailable, t.s.name, n, t.r.quorum, join(errs...))
	}
	return token, nil
}

// onMasters runs call on the masters is at once, each awaited at most the node timeout, and
// returns the values it got, by master. A master whose call failed or did not answer in time
// is given back (its hold cannot count), with its error in errs; a late call goes on in the
// background.
func (t *redlockTake) onMasters(ctx context.Context, is []int, what string, call func(context.Context, *Client) (uint64, error)) (vals map[int]uint64, errs []error) {
	d := t.r.nodeTimeout(t.s.cfg.leaseTTL())
	type answer struct {
		i   int
		v   uint64
		err error
	}
	answers := make(chan answer, len(is))
	pending := make(map[int]bool, len(is))
	for _, i := range is {
		n := t.r.nodes[i]
		pending[i] = true
		if !n.goBackground() {
			answers <- answer{i, 0, fmt.Errorf("%w: lock %q", ErrClosed, t.s.name)}
			continue
		}
		go func() {
			defer n.wg.Done()
			cctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			v, err := call(cctx, n)
			answers <- answer{i, v, err}
		}()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	vals = make(map[int]uint64, len(is))
	for len(pending) > 0 {
		select {
		case a := <-answers:
			delete(pending, a.i)
			if a.err != nil {
				errs = append(errs, redisErr(what, t.s.name, a.err))
				t.drop(a.i)
				continue
			}
			vals[a.i] = a.v
		case <-timer.C:
			for i := range pending {
				errs = append(errs, fmt.Errorf("%w: lock %q: %w within %v (%s)", ErrUnavailable, t.s.name, errSlowMaster, d, what))
				t.drop(i)
			}
			clear(pending)
		}
	}
	return vals, errs
}

// lasting orders PTTLs by when the key expires: one without a TTL (PTTL -1) never does, one
// already gone (-2, expired between the reads) has.
func lasting(ttl time.Duration) time.Duration {
	switch {
	case ttl == -1: // go-redis passes PTTL's -1 and -2 through as nanoseconds
		return math.MaxInt64
	case ttl < 0:
		return 0
	}
	return ttl
}

// foreignHolder groups the masters whose key holds something dlock did not write (no owner id
// starts with a NUL byte).
const foreignHolder = "\x00foreign"

// inspect reads the lock on every master at once (Client.Inspect). The quorum's view is Held
// by the owner holding the lock on a quorum of the masters, or Foreign when a quorum holds
// values dlock did not write; each master's own state is in Masters.
func (r *redlock) inspect(ctx context.Context, name string) (LockInfo, error) {
	infos := make([]LockInfo, len(r.nodes))
	errs := make([]error, len(r.nodes))
	r.each(func(i int, n *Client) {
		infos[i], errs[i] = n.Inspect(ctx, name)
		infos[i].Name, infos[i].Master = name, r.nodeName(i)
		if errs[i] != nil {
			infos[i].Error = errs[i].Error()
		}
	})
	info := LockInfo{Name: name, Masters: infos}
	byOwner := make(map[string][]LockInfo)
	answered := 0
	for i, m := range infos {
		if errs[i] != nil {
			continue
		}
		answered++
		info.Waiters = max(info.Waiters, m.Waiters)
		info.Recent = info.Recent || m.Recent || m.Held // used lately on one master at least
		switch {
		case m.Held && m.Foreign:
			byOwner[foreignHolder] = append(byOwner[foreignHolder], m)
		case m.Held && m.Owner != "":
			owner := callOwner(m.Owner)
			byOwner[owner] = append(byOwner[owner], m)
		}
	}
	for owner, ms := range byOwner {
		if len(ms) < r.quorum {
			continue
		}
		ttls := make([]time.Duration, 0, len(ms))
		info.Held, info.Owner, info.HoldCount = true, owner, ms[0].HoldCount
		if owner == foreignHolder {
			// Held, on a quorum, by values dlock did not write: no owner to name.
			info.Owner, info.Foreign = "", true
		}
		for _, m := range ms {
			info.Token = max(info.Token, m.Token)
			ttls = append(ttls, m.TTL)
		}
		// The quorum lets go when the last of its shortest-lived masters does; a TTL below
		// 0 (a key without one: a foreign value) never expires, so it sorts last.
		slices.SortFunc(ttls, func(a, b time.Duration) int { return cmp.Compare(lasting(a), lasting(b)) })
		info.TTL = ttls[len(ttls)-r.quorum]
	}
	info.Recent = info.Recent && !info.Held
	if answered < r.quorum {
		return info, fmt.Errorf("%w: inspect %q: %d of %d masters answered, a quorum is %d: %w", ErrUnavailable, name, answered, len(r.nodes), r.quorum, join(errs...))
	}
	return info, nil
}

// forceRelease breaks the lock on every master at once (Client.ForceRelease).
func (r *redlock) forceRelease(ctx context.Context, name string) (bool, error) {
	held := make([]bool, len(r.nodes))
	errs := make([]error, len(r.nodes))
	r.each(func(i int, n *Client) { held[i], errs[i] = n.ForceRelease(ctx, name) })
	return slices.Contains(held, true), join(errs...)
}

// nodeName names master i for people: its address, or its place in the list.
func (r *redlock) nodeName(i int) string {
	if rc, ok := r.nodes[i].rdb.(*redis.Client); ok && rc.Options().Addr != "FailoverClient" {
		return rc.Options().Addr
	}
	return "master " + strconv.Itoa(i)
}

// callOwner is the owner id of the call a Redlock master's hold belongs to: a generated call
// id (a handle's 32 hex digits, ".", a sequence number) in a later epoch (redlockTake) is that
// call's; any other id, WithOwner's (never given epochs), is its own.
func callOwner(id string) string {
	base, epoch, ok := strings.Cut(id, "~")
	handle, seq, dot := strings.Cut(base, ".")
	if !ok || !dot || len(handle) != 32 || !isBase(handle, 16) || !isBase(seq, 36) || !isBase(epoch, 36) {
		return id
	}
	return base
}

// isBase reports whether s is a non-empty number in lower-case base b (16 or 36).
func isBase(s string, b int) bool {
	digits := "0123456789abcdefghijklmnopqrstuvwxyz"[:b]
	return s != "" && strings.Trim(s, digits) == ""
}
