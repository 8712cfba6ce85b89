package dlock_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A waiter whose Redis user may not subscribe polls (every 50 ms), and does not spin: its
// subscriptions were never made, which is not the server dropping one (a slot that moved, after
// which the waiter subscribes again at once). Found by review: 3264 attempts in 1 s before.
func TestWaiterWithoutPubSubPolls(t *testing.T) {
	var rules []string
	for _, r := range minimalACL {
		if !strings.HasPrefix(r, "&") {
			rules = append(rules, r)
		}
	}
	srv := redistest.StartT(t, redistest.Config{})
	admin := srv.Client()
	defer admin.Close()
	rdb := aclClient(t, srv, "nochan", rules...)
	ctx := ctxT(t)
	a := dlock.New(rdb)
	defer a.Close(ctx)
	b := dlock.New(rdb)
	defer b.Close(ctx)
	name := redistest.Name(t)
	l, err := a.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	// First wait: the SUBSCRIBE is refused, noPubSub is set.
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, _ = b.Mutex(name).Lock(wctx)
	cancel()
	before := evalshaCalls(t, admin)
	wctx, cancel = context.WithTimeout(ctx, time.Second)
	_, err = b.Mutex(name).Lock(wctx)
	cancel()
	n := evalshaCalls(t, admin) - before
	t.Logf("Lock: %v; EVALSHA calls in a 1s wait: %d", err, n)
	if n > 60 { // polling every 50ms: about 20
		t.Errorf("hot loop: %d attempts in 1s", n)
	}
}

func evalshaCalls(t *testing.T, admin *redis.Client) int {
	t.Helper()
	info := admin.Info(context.Background(), "commandstats").Val()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(v, ",", 2)[0])
			return n
		}
	}
	return 0
}
