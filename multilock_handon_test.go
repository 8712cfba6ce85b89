package dlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A MultiLock's release hands each member to its first waiter at once, however briefly that
// has waited, instead of freeing it within the barging window for the waiter to take with an
// attempt of its own: a MultiLock's holds belong to one call, which never takes them again, so
// a freed member only went to whoever came first, and each hand-off cost the waiter a wake-up
// and a script (bench multi-4x8: about 8 % of the throughput). The waiter here is a raw
// script, so nothing takes a freed member after the release: it is either granted or free.
func TestMultiLockReleaseHandsOnAtOnce(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	a, b := redistest.Name(t)+"a", redistest.Name(t)+"b"
	l := must(t)(c.MultiLock([]string{a, b}).Lock(ctx))

	base := lockKey(a)
	k := lockNames{base, base + ":fence", base + ":log", base + ":queue", base + ":live", base + ":released"}
	if res := acquireMode(t, rdb, k, "W", "hw", ""); res[0] != 0 {
		t.Fatalf("W's attempt on a held member: %v, want queued", res)
	}
	// W has waited for no time at all: its place is ahead of the server's clock (an hour,
	// so the clock cannot catch up), well inside any barging window.
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAddXX(ctx, k.queue, redis.Z{Score: float64(now.Add(time.Hour).UnixMilli()), Member: "W"}).Err(); err != nil {
		t.Fatal(err)
	}

	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if h := rdb.HGetAll(ctx, k.lock).Val(); h["W"] != "1" {
		t.Errorf("member %s after the MultiLock's Unlock: %v, want it granted to W, first in line", a, h)
	}
	if n := rdb.Exists(ctx, lockKey(b)).Val(); n != 0 {
		t.Errorf("member %s, with nobody waiting, still exists after Unlock", b)
	}
}
