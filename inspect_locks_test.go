package dlock

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// globMatch agrees with Redis's own matcher (KEYS) on patterns of every form it implements,
// including random ones over the bytes that mean something in a pattern, and answers a
// pattern of many stars that does not match at once (backtracking over every * was
// exponential: Locks never returned).
func TestGlobMatchIsRedisMatch(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	rdb := srv.Client()
	defer rdb.Close()
	ctx := context.Background()
	subjects := []string{"", "a", "ab", "abc", "a}b", "a*", "jobs/clean/up", "order:1:x", "order:1:y", "b", "d",
		"[x]", `a\b`, strings.Repeat("a", 40) + "}b", "\xff", "\x80b", "é"}
	r := rand.New(rand.NewPCG(1, 2))
	random := func(alphabet string, n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	for range 300 {
		subjects = append(subjects, random(`ab-]^\[`, 1+r.IntN(4)))
	}
	for _, s := range subjects {
		if s != "" {
			rdb.Set(ctx, s, 1, 0)
		}
	}
	patterns := []string{"*", "a", "a*", "a?c", "a?", "[ab]*", "[^ab]", "[a-c]", "[c-a]", `a\*`, `a\}b`,
		"jobs/*", "*b*", "order:*:x", "*:*", `\[x]`, `[\]]`, `a\\b`, "**c", "?", "[x-]", strings.Repeat("*a", 12),
		"[a-\xff]", "[\x80-b]*", "[^a-\xff]"} // Redis compares range bytes as signed C chars
	for range 3000 {
		patterns = append(patterns, random(`ab-]^\[*?`, 1+r.IntN(5)))
	}
	for _, p := range patterns {
		keys, err := rdb.Keys(ctx, p).Result()
		if err != nil {
			t.Fatal(err)
		}
		redis := map[string]bool{}
		for _, k := range keys {
			redis[k] = true
		}
		for _, s := range subjects {
			if s != "" && globMatch(p, s) != redis[s] {
				t.Fatalf("pattern %q, name %q: globMatch says %v, Redis %v", p, s, !redis[s], redis[s])
			}
		}
	}
}

// Locks lists the names that match its pattern and no other: SCAN's match, prefix{pattern}*,
// also takes a name with "}" in it ("a}b", key prefix{a}b}) for pattern "a". A key that only
// looks like a lock's (prefix{}, prefix{}:fence, left by hand) is no lock, and does not make
// the listing fail. Redis down is ErrUnavailable for Locks, FencedSet and FencedGet, as for
// every other call.
func TestLocksListsOnlyTheNamesMatchingItsPattern(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	prefix := "locks" + strings.ReplaceAll(redistest.Name(t), "#", "") + ":"
	c := New(rdb, WithKeyPrefix(prefix))
	defer c.Close(ctx)
	for _, name := range []string{"a", "a}b", "jobs/clean/up", `a\`} {
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
	}
	for _, stray := range []string{prefix + "{}", prefix + "{}}", prefix + "{}:fence"} {
		if err := rdb.Set(ctx, stray, "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for pattern, want := range map[string][]string{
		"a":       {"a"},
		"a*":      {"a", `a\`, "a}b"},
		"jobs/*":  {"jobs/clean/up"},
		"*":       {"a", `a\`, "a}b", "jobs/clean/up"},
		`a\`:      {`a\`}, // a lone \ at the end of the pattern would escape SCAN's }
		"[a":      {"a"},  // so would an unclosed class take it in
		"a}b":     {"a}b"},
		"nothing": nil,
	} {
		list, err := c.Locks(ctx, pattern)
		var names []string
		for _, info := range list {
			names = append(names, info.Name)
		}
		if err != nil || !slices.Equal(names, want) {
			t.Errorf("Locks(%q) = %q, %v; want %q", pattern, names, err, want)
		}
	}
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer dead.Close()
	down := New(dead, WithKeyPrefix(prefix))
	defer down.Close(ctx)
	if _, err := down.Locks(ctx, "*"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Locks with Redis down = %v, want ErrUnavailable", err)
	}
	if err := FencedSet(ctx, dead, "res", "v", 1); !errors.Is(err, ErrUnavailable) {
		t.Errorf("FencedSet with Redis down = %v, want ErrUnavailable", err)
	}
	if _, _, err := FencedGet(ctx, dead, "res"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("FencedGet with Redis down = %v, want ErrUnavailable", err)
	}
}

// read_fields reads on a master at maxmemory (noeviction), where a script that may write is
// refused (OOM): it writes nothing, and a latch's Wait or a lease's loss check must not fail
// because memory is full.
func TestReadFieldsRunsOnAMasterAtMaxmemory(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	rdb := srv.Client()
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.HSet(ctx, "h", "#k", "latch", "#n", 2).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer rdb.ConfigSet(ctx, "maxmemory", "0")
	if err := rdb.Set(ctx, "x", 1, 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("SET at maxmemory 1 = %v; the test needs a server refusing writes", err)
	}
	res, err := scripts.ReadFields.Run(ctx, rdb, []string{"h"}, "#k", "#n").Slice()
	if err != nil || len(res) != 3 || res[0] != int64(1) || res[1] != "latch" || res[2] != "2" {
		t.Fatalf("read_fields at maxmemory = %v, %v; want [1 latch 2]", res, err)
	}
}

// Inspect reports what it can of a name whose keys hold values dlock did not write: a foreign
// hash at the lock key is Foreign with no Owner or Token read from its fields, and a key of
// another type at the queue's name does not make the read (nor Locks) fail.
func TestInspectForeignValues(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	c := New(rdb)
	defer c.Close(ctx)
	name := redistest.Name(t)
	k := lockKeys(c.cfg.keyPrefix(), name)
	rdb.HSet(ctx, k.lock, "alice", "3", "#t", "77")
	info, err := c.Inspect(ctx, name)
	if err != nil || !info.Foreign || !info.Held || info.Owner != "" || info.Token != 0 || info.HoldCount != 0 {
		t.Errorf("Inspect of a foreign hash = %+v, %v; want Held and Foreign, no Owner, Token or HoldCount", info, err)
	}
	other := redistest.Name(t)
	l, err := c.Mutex(other).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	rdb.Set(ctx, lockKeys(c.cfg.keyPrefix(), other).queue, "not a queue", 0)
	if info, err := c.Inspect(ctx, other); err != nil || !info.Held || info.Owner == "" {
		t.Errorf("Inspect with a string at the queue's key = %+v, %v; want the held lock read", info, err)
	}
}

// Inspect fails when one of its reads is refused or cannot be served, rather than show a held
// lock as free or without its waiters: NOPERM on the lock's other keys (an operator's ACL
// granting the lock key only), BUSY (a script running long). A Redlock's view of a lock that
// a quorum of masters hold as values dlock did not write is Held and Foreign, with their TTL.
// Locks works under a key prefix that is not UTF-8.
func TestInspectRefusedOrBusyAndForeignOnARedlock(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{Args: []string{"--busy-reply-threshold", "50"}})
	rdb := srv.Client()
	defer rdb.Close()
	ctx := context.Background()
	c := New(rdb, WithKeyPrefix("ins:"))
	defer c.Close(ctx)
	l, err := c.Mutex("job").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	if err := srv.AddACLUser(ctx, "ops", "pw", "+@all", "~ins:{job}", "&*"); err != nil {
		t.Fatal(err)
	}
	ops := srv.ClientFor("ops", "pw")
	defer ops.Close()
	oc := New(ops, WithKeyPrefix("ins:"))
	defer oc.Close(ctx)
	if info, err := oc.Inspect(ctx, "job"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Inspect with the queue's read refused = %+v, %v; want the NOPERM error", info, err)
	}

	odd := New(rdb, WithKeyPrefix("p\xff:"))
	defer odd.Close(ctx)
	lo, err := odd.Mutex("a").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Unlock(ctx)
	if list, err := odd.Locks(ctx, "*"); err != nil || len(list) != 1 || list[0].Name != "a" {
		t.Errorf("Locks under the prefix p\\xff: = %+v, %v; want [a]", list, err)
	}

	busy := srv.Client()
	defer busy.Close()
	done := make(chan struct{})
	go func() { defer close(done); busy.Eval(context.Background(), "while true do end", nil) }()
	for rdb.Ping(ctx).Err() == nil { // until Redis answers BUSY
		time.Sleep(5 * time.Millisecond)
	}
	info, err := c.Inspect(ctx, "job")
	for rdb.ScriptKill(ctx).Err() != nil {
		time.Sleep(5 * time.Millisecond)
	}
	<-done
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Inspect of a held lock while Redis is BUSY = %+v, %v; want ErrUnavailable", info, err)
	}

	var masters []redis.UniversalClient
	for range 3 {
		m := redistest.StartT(t, redistest.Config{}).Client()
		defer m.Close()
		key := lockKeys(DefaultKeyPrefix, "f").lock
		m.HSet(ctx, key, "owner-1", "1")
		m.PExpire(ctx, key, time.Minute)
		masters = append(masters, m)
	}
	rl := NewRedlock(masters)
	defer rl.Close(ctx)
	if info, err := rl.Inspect(ctx, "f"); err != nil || !info.Foreign || !info.Held || info.TTL <= 0 || info.Owner != "" {
		t.Errorf("Redlock Inspect of a foreign hash on every master = %+v, %v; want Held and Foreign, with the TTL, no Owner", info, err)
	}
	// A foreign value without a TTL never expires: the quorum of {no TTL, 1 min} lets go in
	// a minute, not "never" (PTTL -1 sorted first).
	g := lockKeys(DefaultKeyPrefix, "g").lock
	masters[0].HSet(ctx, g, "x", "1")
	masters[1].HSet(ctx, g, "x", "1")
	masters[1].PExpire(ctx, g, time.Minute)
	if info, err := rl.Inspect(ctx, "g"); err != nil || !info.Held || info.TTL < 50*time.Second {
		t.Errorf("Redlock Inspect of foreign values on 2 of 3 masters, one without a TTL = %+v, %v; want Held with the TTL of about a minute", info, err)
	}
}
