package dlock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// beforeHook runs before ahead of every command of a go-redis client that match accepts.
type beforeHook struct {
	match  func(cmd redis.Cmder) bool
	before func()
}

func (h beforeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h beforeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			h.before()
		}
		return next(ctx, cmd)
	}
}
func (h beforeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// isFenceFloor matches the raise of a Redlock lease's fencing counter on a master (fence_floor.lua).
func isFenceFloor(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	name, _ := args[0].(string)
	return strings.EqualFold(name, "evalsha") && args[1] == scripts.FenceFloor.Hash() // go-redis sends EVALSHA first
}

// fenceMasters starts three masters for a Redlock whose last one's clock runs 10 s ahead, so
// its tokens are the highest and the others' fencing counters are raised; the first is down,
// so a lease holds exactly a quorum (masters 1 and 2).
func fenceMasters(t *testing.T) (clients []redis.UniversalClient, raw []*redis.Client) {
	t.Helper()
	for i := range 3 {
		var cfg redistest.Config
		if i == 2 {
			cfg.ClockOffset = "+10s"
		}
		s := redistest.StartT(t, cfg)
		rc := s.Client()
		t.Cleanup(func() { _ = rc.Close() })
		raw = append(raw, rc)
		clients = append(clients, rc)
		if i == 0 {
			s.Kill()
		}
	}
	return clients, raw
}

// A Redlock hands out no lease that has already ended: when a hold of a bare quorum is lost
// while the lease's fencing token is being raised (its master restarted empty, say), TryLock
// says not obtained and Lock goes on until it holds a quorum again. Found by review: the
// lease was returned with a nil error, ended already, to a caller that checks only the error.
func TestRedlockHoldLostDuringTheFenceRaiseIsNoLease(t *testing.T) {
	for _, cohort := range []bool{false, true} {
		for _, wait := range []bool{false, true} {
			clients, raw := fenceMasters(t)
			c := NewRedlock(clients)
			defer c.Close(context.Background())
			var opts []Option
			if !cohort {
				opts = append(opts, WithoutCohort())
			}
			m := c.Mutex(redistest.Name(t), opts...)
			var once sync.Once
			raw[1].AddHook(beforeHook{match: isFenceFloor, before: func() {
				once.Do(func() {
					// Master 2 loses the key, and the Client learns it (as a push would tell it).
					raw[2].Del(context.Background(), m.keys.lock)
					n := c.rl.nodes[2]
					n.mu.Lock()
					var hs []*hold
					for h := range n.holds {
						hs = append(hs, h)
					}
					n.mu.Unlock()
					for _, h := range hs {
						h.lose(errRenewRefused)
					}
				})
			}})
			ctx := context.Background()
			var l *Lease
			var err error
			if wait {
				l, err = m.Lock(ctx)
			} else {
				l, err = m.TryLock(ctx)
			}
			switch {
			case !wait && cohort && err == nil:
				// A cohort takes another hold when the one it got ended at once: fine, if valid.
			case !wait:
				if !errors.Is(err, ErrNotObtained) || l != nil {
					t.Errorf("cohort %v: TryLock whose hold on master 2 was lost during the fence raise: lease %v, %v; want ErrNotObtained and no lease", cohort, l != nil, err)
				}
				continue
			case err != nil:
				t.Errorf("cohort %v: Lock whose hold on master 2 was lost during the fence raise: %v; want a lease (it tries again)", cohort, err)
				continue
			}
			select {
			case <-l.Done():
				t.Errorf("cohort %v, wait %v: a lease handed out ended already: %v", cohort, wait, l.Err())
			default:
				if l.Remaining() <= 0 {
					t.Errorf("cohort %v, wait %v: a lease handed out with nothing remaining", cohort, wait)
				}
			}
			_ = l.Unlock(ctx)
		}
	}
}

// When the caller's ctx ends while a Redlock lease's fencing token is being raised, Lock
// returns ErrNotObtained with the ctx's error, as its contract says. Found by review: it
// returned the raise's ErrUnavailable.
func TestRedlockCtxEndingDuringTheFenceRaise(t *testing.T) {
	clients, raw := fenceMasters(t)
	c := NewRedlock(clients)
	defer c.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	raw[1].AddHook(beforeHook{match: isFenceFloor, before: func() { once.Do(cancel) }})
	l, err := c.Mutex(redistest.Name(t), WithoutCohort()).Lock(ctx)
	if l != nil || !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Errorf("Lock whose ctx ended during the fence raise: lease %v, %v; want no lease, ErrNotObtained and context.Canceled", l != nil, err)
	}
}
