package dlock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// globMatch agrees with Redis's own SCAN MATCH on every pattern form it implements.
func TestGlobMatchIsRedisMatch(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	base := "glob" + strings.ReplaceAll(redistest.Name(t), "#", "") + ":"
	subjects := []string{"", "a", "ab", "abc", "a}b", "a*", "jobs/clean/up", "order:1:x", "order:1:y", "b", "d", "[x]", `a\b`}
	for _, s := range subjects {
		if err := rdb.Set(ctx, base+s, 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"*", "a", "a*", "a?c", "a?", "[ab]*", "[^ab]", "[a-c]", "[c-a]", `a\*`, `a\}b`,
		"jobs/*", "*b*", "order:*:x", "*:*", `\[x]`, `[\]]`, `a\\b`, "**c", "?"} {
		var redis []string
		iter := rdb.Scan(ctx, 0, globEscape(base)+p, 1000).Iterator()
		for iter.Next(ctx) {
			redis = append(redis, strings.TrimPrefix(iter.Val(), base))
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		var ours []string
		for _, s := range subjects {
			if globMatch(p, s) {
				ours = append(ours, s)
			}
		}
		slices.Sort(redis)
		slices.Sort(ours)
		if !slices.Equal(redis, ours) {
			t.Errorf("pattern %q: Redis matches %q, globMatch %q", p, redis, ours)
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
	for _, name := range []string{"a", "a}b", "jobs/clean/up"} {
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
		"a*":      {"a", "a}b"},
		"jobs/*":  {"jobs/clean/up"},
		"*":       {"a", "a}b", "jobs/clean/up"},
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
