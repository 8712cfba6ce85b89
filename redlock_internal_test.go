package dlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A Redlock lease is handed out only once every master it keeps has its fencing counter at the
// lease's token. Otherwise (found by review) a later lease could hold a quorum of masters none
// of which was raised: its own hold on master 0 taken before this lease's raise reached master
// 0, and master 1, held by this lease but never raised, after this lease let it go; its token
// would then be below this one's. Here master 1 dies between its acquire and the raise.
func TestRedlockRaisesTheFenceOnEveryHeldMaster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var srv []*redistest.Server
	var masters []redis.UniversalClient
	for i := range 3 {
		cfg := redistest.Config{}
		if i == 2 {
			cfg.ClockOffset = "+10s" // master 2's tokens are the highest: the others need raising
		}
		s := redistest.StartT(t, cfg)
		rc := s.Client()
		t.Cleanup(func() { _ = rc.Close() })
		srv = append(srv, s)
		masters = append(masters, rc)
	}
	c := NewRedlock(masters, WithTTL(5*time.Second))
	defer c.Close(context.Background())
	name := redistest.Name(t)
	m := c.Mutex(name)
	s := holdSpec{name: name, keys: m.keys, cfg: m.cfg, owner: "L1"}
	take := &redlockTake{r: c.rl, s: s, held: make([]*hold, 3), owners: []string{"L1", "L1", "L1"}}
	for i := 1; i <= 2; i++ {
		h, _, err := c.rl.nodes[i].tryHold(ctx, s, false)
		if err != nil {
			t.Fatal(err)
		}
		take.held[i] = h
	}
	srv[1].Kill()
	token, err := take.raiseFence(ctx)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("raise with held master 1 down: token %d, err %v; want ErrUnavailable (masters 0 and 2 are a quorum, but master 1 is held and not raised)", token, err)
	}
	if take.held[1] != nil {
		t.Fatal("the held master that did not confirm the raise was kept")
	}
	t.Logf("%v", err)
}

// When a Redlock cohort's quorum is lost (quorum.holdEnded), the local holder's lease ends
// before the holds still held are given back (found by review: they were given back first). With 4
// masters (a quorum of 3), losing 2 ends the quorum but leaves only 2 free masters, so the
// release of our other 2 is what lets another process in. The cohort's end callback is held
// up here by holding co.mu (standing for any delay of that goroutine: scheduling, a GC pause,
// co.mu taken by another goroutine): another process then holds the lock while our lease's
// Done is still open. A plain Redlock lease (holding.end, then lostMember) tells its leases
// first.
func TestRedlockCohortEndsTheLeaseBeforeGivingBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var masters []redis.UniversalClient
	var raw []*redis.Client
	for range 4 {
		s := redistest.StartT(t, redistest.Config{})
		rc, r := s.Client(), s.Client()
		t.Cleanup(func() { _ = rc.Close(); _ = r.Close() })
		masters = append(masters, rc)
		raw = append(raw, r)
	}
	c := NewRedlock(masters)
	defer c.Close(context.Background())
	other := NewRedlock(masters)
	defer other.Close(context.Background())
	name := redistest.Name(t)
	m := c.Mutex(name)
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range l.hd.holds() {
		<-h.tracked // push loss detection armed on every master
	}
	c.mu.Lock()
	co := c.cohorts[m.cohort]
	c.mu.Unlock()
	co.mu.Lock()
	locked := true
	defer func() {
		if locked {
			co.mu.Unlock()
		}
	}()
	key := m.keys.lock
	for _, r := range raw[:2] {
		if err := r.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Our lease cannot be told while co.mu is held: masters 2 and 3 must not be given back meanwhile.
	released := false
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if raw[2].Exists(ctx, key).Val() == 0 && raw[3].Exists(ctx, key).Val() == 0 {
			released = true
			break
		}
	}
	if released {
		select {
		case <-l.Done():
		default:
			l2, err := other.Mutex(name, WithoutCohort()).TryLock(ctx)
			if err != nil {
				t.Fatalf("other process: %v", err)
			}
			defer l2.Unlock(ctx)
			select {
			case <-l.Done():
			default:
				t.Errorf("another process holds the lock (token %d) while our lease (token %d) is still held as far as its holder can tell (Done open, Err %v)", l2.Token(), l.Token(), l.Err())
			}
		}
	}
	co.mu.Unlock()
	locked = false
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease never ended")
	}
	for deadline := time.Now().Add(5 * time.Second); raw[2].Exists(ctx, key).Val()+raw[3].Exists(ctx, key).Val() > 0 && !released; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the holds left were not given back after the lease ended")
		}
	}
}

// A master that does not answer within the Redlock's wait counts as slow (errSlowMaster: the
// next attempt on it goes under a fresh owner id, as the given-up one may still land) also
// when go-redis, with ContextTimeoutEnabled, ends the call by its read deadline, an i/o
// timeout rather than the ctx's error. Found by review: only the ctx's error was recognised.
func TestRedlockMasterCutShortByItsReadDeadlineIsSlow(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	o := srv.Options()
	o.ContextTimeoutEnabled = true
	rc := redis.NewClient(o)
	t.Cleanup(func() { _ = rc.Close() })
	n := New(rc)
	defer n.Close(context.Background())
	name := redistest.Name(t)
	m := n.Mutex(name)
	if _, err := rc.Ping(context.Background()).Result(); err != nil { // connected before the pause
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	s := holdSpec{name: name, keys: m.keys, cfg: m.cfg, owner: "L1"}
	h, err := n.tryHoldWithin(context.Background(), s, 20*time.Millisecond, errSlowMaster)
	if h != nil || !errors.Is(err, errSlowMaster) || !errors.Is(err, ErrUnavailable) {
		t.Errorf("an attempt on a paused master, cut by its read deadline: %v, %v; want ErrUnavailable with errSlowMaster", h != nil, err)
	}
}

// Under WithReplicaAck a Redlock waits for each master's answer the acknowledgement's timeout
// longer: the WAIT is part of it. Masters without replicas then give the answer a single
// server gives, ErrNotReplicated. Found by review: with an acknowledgement timeout above the
// Redlock's wait for a master (200 ms), no master "answered" and Lock retried until its ctx
// ended, never saying why.
func TestRedlockWaitsOutTheReplicasAcknowledgement(t *testing.T) {
	var masters []redis.UniversalClient
	for range 3 {
		rc := redistest.StartT(t, redistest.Config{}).Client()
		t.Cleanup(func() { _ = rc.Close() })
		masters = append(masters, rc)
	}
	c := NewRedlock(masters, WithReplicaAck(1, 300*time.Millisecond))
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.Mutex(redistest.Name(t), WithoutCohort()).Lock(ctx)
	if l != nil || !errors.Is(err, ErrNotReplicated) || ctx.Err() != nil {
		t.Errorf("a Redlock Lock acknowledged by no replica (there are none): %v, %v (ctx %v); want ErrNotReplicated at once", l != nil, err, ctx.Err())
	}
}
