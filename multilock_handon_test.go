package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A MultiLock's release hands each member to its first waiter at once, however briefly that
// has waited, instead of freeing it within the barging window for the waiter to take with an
// attempt of its own: a waiting MultiLock holds nothing and needs the member handed to it, and
// each freed member cost it a wake-up and a script, and often the member (bench multi-4x8:
// about 8 % of the throughput). The waiter here is a raw script, so nothing takes a freed
// member after the release: it is either granted or free. Each way a member's hold is
// released: a lease's Unlock of several members (one round trip) and of one, Close, and a
// member given back when another is lost.
func TestMultiLockReleaseHandsOnAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members int
		end     func(t *testing.T, c *dlock.Client, rdb *redis.Client, l *dlock.Lease, others []string)
	}{
		{"Unlock", 2, func(t *testing.T, _ *dlock.Client, _ *redis.Client, l *dlock.Lease, _ []string) {
			if err := l.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
		}},
		{"Unlock of one member", 1, func(t *testing.T, _ *dlock.Client, _ *redis.Client, l *dlock.Lease, _ []string) {
			if err := l.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
		}},
		{"Close", 2, func(t *testing.T, c *dlock.Client, _ *redis.Client, _ *dlock.Lease, _ []string) {
			if err := c.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
		}},
		{"another member lost", 2, func(t *testing.T, _ *dlock.Client, rdb *redis.Client, l *dlock.Lease, others []string) {
			if err := rdb.Del(context.Background(), lockKey(others[0])).Err(); err != nil {
				t.Fatal(err)
			}
			waitDone(t, l, 5*time.Second)
			if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
				t.Fatalf("lease after a member's key went: %v, want ErrLeaseLost", l.Err())
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, rdb := newClient(t)
			ctx := ctxT(t)
			names := []string{redistest.Name(t) + "a", redistest.Name(t) + "b"}[:tc.members]
			l := must(t)(c.MultiLock(names).Lock(ctx))

			base := lockKey(names[0])
			k := lockNames{base, base + ":fence", base + ":log", base + ":queue", base + ":live", base + ":released"}
			if res := acquireMode(t, rdb, k, "W", "hw", ""); res[0] != 0 {
				t.Fatalf("W's attempt on a held member: %v, want queued", res)
			}
			// W has waited for no time at all: its place is ahead of the server's clock (an
			// hour, so the clock cannot catch up), well inside any barging window.
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.ZAddXX(ctx, k.queue, redis.Z{Score: float64(now.Add(time.Hour).UnixMilli()), Member: "W"}).Err(); err != nil {
				t.Fatal(err)
			}

			tc.end(t, c, rdb, l, names[1:])
			// A lost lease gives its other members back in the background: wait until the
			// MultiLock's hold of the first one is gone (granted to W, or freed).
			var h map[string]string
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				h = rdb.HGetAll(ctx, k.lock).Val()
				if len(h) == 0 || h["W"] != "" || time.Now().After(deadline) {
					break
				}
			}
			if h["W"] != "1" || h["#hw"] != "1" {
				t.Errorf("member %s after the MultiLock let it go: %v, want it granted to W, first in line", names[0], h)
			}
		})
	}
}
