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
