package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// dlock's slot function agrees with the Cluster specification's examples and with a server.
func TestKeySlot(t *testing.T) {
	for key, want := range map[string]int{
		"123456789": 12739, "foo": 12182, "{user1000}.following": 3443, "{user1000}.followers": 3443,
		"foo{}{bar}": 8363, "foo{{bar}}zap": 4015, "foo{bar}{zap}": 5061,
	} {
		if got := dlock.KeySlot(key); got != want {
			t.Errorf("KeySlot(%q) = %d, want %d", key, got, want)
		}
	}
}

// scriptCalls sums the scripts every master of rdb ran since its statistics were reset.
func scriptCalls(t *testing.T, ctx context.Context, nodes []*redis.Client) int {
	t.Helper()
	total := 0
	for _, n := range nodes {
		info, err := n.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if rest, ok := strings.CutPrefix(line, cmd); ok {
					v, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
					total += v
				}
			}
		}
	}
	return total
}

func resetStats(t *testing.T, ctx context.Context, nodes []*redis.Client) {
	t.Helper()
	for _, n := range nodes {
		if err := n.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Free members that share a slot are taken by one script (issue 10: "one script when all
// names share a hash slot"); a taken member still sends the MultiLock to its queue.
func TestMultiLockTakesFreeMembersInOneScript(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	base := redistest.Name(t)
	names := []string{base + "c", base + "a", base + "b"}
	ml := c.MultiLock(names)
	_ = must(t)(ml.TryLock(ctx)).Unlock(ctx) // loads the script
	resetStats(t, ctx, []*redis.Client{rdb})
	l := must(t)(ml.TryLock(ctx))
	if n := scriptCalls(t, ctx, []*redis.Client{rdb}); n != 1 {
		t.Errorf("TryLock of 3 free members ran %d scripts, want 1", n)
	}
	for _, n := range names {
		if _, err := c.Mutex(n).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("Mutex on member %s: %v, want ErrNotObtained", n, err)
		}
	}
	tokens := l.Tokens()
	if len(tokens) != 3 || tokens[names[0]] == 0 || tokens[names[1]] == tokens[names[2]] {
		t.Fatalf("Tokens %v: want one per member", tokens)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	held := must(t)(c.Mutex(names[2]).Lock(ctx))
	ch := make(chan error, 1)
	go func() {
		l, err := ml.Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		ch <- err
	}()
	waitQueued(t, c, names[2], 1)
	for _, n := range names[:2] {
		if info, err := c.Inspect(ctx, n); err != nil || info.Held {
			t.Fatalf("free member %s while the MultiLock waits: %+v, %v", n, info, err)
		}
	}
	_ = held.Unlock(ctx)
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
}

// On a Cluster, names sharing a hash tag share a slot and are taken by one script; names on
// other slots are taken member by member.
func TestMultiLockOneScriptPerSlotOnCluster(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	c := dlock.New(cc)
	defer c.Close(ctx)
	var masters []*redis.Client
	var mu sync.Mutex
	err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, n)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	base := redistest.Name(t)
	for _, tc := range []struct {
		names []string
		want  int
	}{
		{[]string{"{" + base + "}:a", "{" + base + "}:b", "{" + base + "}:c"}, 1},
		{[]string{base + "-0", base + "-1", base + "-2"}, 3},
	} {
		if slots := distinctSlots(tc.names); (slots == 1) != (tc.want == 1) {
			t.Fatalf("names %v on %d slots", tc.names, slots)
		}
		ml := c.MultiLock(tc.names)
		_ = must(t)(ml.TryLock(ctx)).Unlock(ctx)
		resetStats(t, ctx, masters)
		l := must(t)(ml.TryLock(ctx))
		if n := scriptCalls(t, ctx, masters); n != tc.want {
			t.Errorf("TryLock of %v ran %d scripts, want %d", tc.names, n, tc.want)
		}
		for _, n := range tc.names {
			if _, err := c.Mutex(n).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("Mutex on member %s: %v, want ErrNotObtained", n, err)
			}
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func distinctSlots(names []string) int {
	seen := map[int]bool{}
	for _, n := range names {
		seen[dlock.KeySlot(fmt.Sprintf("%s{%s}", dlock.DefaultKeyPrefix, n))] = true
	}
	return len(seen)
}

// A resend of the one-script pass (go-redis retries a script whose reply was lost) finds the
// members it took and answers as the first run did, taking nothing twice; a resend that finds
// only some of them answers -2 (the caller drops them), and a free member whose fence key is
// of another type sends the caller member by member before anything is written.
func TestMultiAcquireScriptResend(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	a, b := names(t), lockNames{}
	b.lock, b.fence, b.queue, b.log = a.lock+"b", a.fence+"b", a.queue+"b", a.log+"b" // same slot: same {tag}
	run := func(ids ...string) []int64 {
		t.Helper()
		return multiAcquire(t, rdb, a, b, ids[0], ids[1])
	}
	first := run("h1", "h2")
	if len(first) != 3 || first[0] != 1 {
		t.Fatalf("first run: %v", first)
	}
	if again := run("h1", "h2"); !slices.Equal(again, first) {
		t.Fatalf("resend: %v, want %v", again, first)
	}
	if other := run("h3", "h4"); other[0] != -1 {
		t.Fatalf("another call of the same owner: %v, want -1 (member by member)", other)
	}
	if n, _ := rdb.HGet(ctx, a.lock, "owner-1").Int(); n != 1 {
		t.Fatalf("hold count after resends: %d, want 1", n)
	}
	rdb.Del(ctx, b.lock)
	if part := run("h1", "h2"); len(part) != 1 || part[0] != -2 {
		t.Fatalf("resend with one member gone: %v, want -2", part)
	}
	rdb.Del(ctx, a.lock, b.fence)
	if err := rdb.HSet(ctx, b.fence, "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	if res := run("h5", "h6"); len(res) != 1 || res[0] != -1 {
		t.Fatalf("fence key of another type: %v, want -1", res)
	}
	if n, _ := rdb.Exists(ctx, a.lock).Result(); n != 0 {
		t.Fatal("a member was written before the check of a later one failed")
	}
}

// A MultiLock of one name that has to wait gets it (once waited for, no member is left for
// a one-script pass).
func TestMultiLockOfOneNameWaits(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	held := must(t)(c.Mutex(name).Lock(ctx))
	ch := make(chan error, 1)
	go func() {
		l, err := c.MultiLock([]string{name}).Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		ch <- err
	}()
	waitQueued(t, c, name, 1)
	_ = held.Unlock(ctx)
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
	_ = must(t)(c.Mutex(name).TryLock(ctx)).Unlock(ctx)
}

// A resend that finds a member of this call's and a later one taken by another owner still
// answers -2, so the caller drops what the lost reply took.
func TestMultiAcquireResendWithALaterMemberTaken(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	a := names(t)
	b := lockNames{lock: a.lock + "b", fence: a.fence + "b", queue: a.queue + "b", log: a.log + "b"}
	run := func(ids ...string) []int64 {
		t.Helper()
		return multiAcquire(t, rdb, a, b, ids[0], ids[1])
	}
	if first := run("h1", "h2"); first[0] != 1 {
		t.Fatalf("first run: %v", first)
	}
	rdb.Del(ctx, b.lock)
	if res := run("other-1", "other-2"); res[0] != -1 { // same owner, another call: a is "held by the caller"
		t.Fatalf("%v", res)
	}
	if err := rdb.HSet(ctx, b.lock, "owner-2", 1, "#x9", 1, "#t", 5, "#v", dlock.LayoutVersion).Err(); err != nil {
		t.Fatal(err)
	}
	if res := run("h1", "h2"); len(res) != 1 || res[0] != -2 {
		t.Fatalf("resend with the later member taken by another owner: %v, want -2", res)
	}
}

// multiAcquire runs the one-script pass over locks a and b for "owner-1" with the hold ids.
func multiAcquire(t *testing.T, rdb *redis.Client, a, b lockNames, idA, idB string) []int64 {
	t.Helper()
	res, err := scripts.MultiAcquire.Run(context.Background(), rdb, []string{a.lock, a.fence, a.queue, a.log, b.lock, b.fence, b.queue, b.log},
		"owner-1", 30000, idA, idB, 60000).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A one-script pass whose reply was lost is cleaned up member by member (the release "only if
// acquired", which marks its hold ids given up); should the pass itself reach Redis only after
// that, it takes nothing.
func TestMultiAcquireArrivingAfterItsCleanUpTakesNothing(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	a := names(t)
	b := lockNames{lock: a.lock + "b", fence: a.fence + "b", queue: a.queue + "b", log: a.log + "b"}
	n, err := scripts.Release.Run(ctx, rdb, []string{b.lock, b.log, b.fence, b.queue, b.live},
		"owner-1", "h2", 60000, b.channel, true, 500, "PUBLISH", false, 0, "").Int64()
	if err != nil || n != 0 {
		t.Fatalf("clean-up of member b: %d, %v; want 0", n, err)
	}
	if res := multiAcquire(t, rdb, a, b, "h1", "h2"); len(res) != 1 || res[0] != -1 {
		t.Fatalf("the late pass: %v, want -1 and nothing taken", res)
	}
	if n := rdb.Exists(ctx, a.lock, b.lock).Val(); n != 0 {
		t.Fatalf("the late pass left %d members held", n)
	}
}
