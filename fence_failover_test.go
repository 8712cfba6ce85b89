package dlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Tokens keep rising across a Cluster failover to a replica whose clock runs 3 s behind the
// old master's, with the lock free and idle before it: the fence key outlives its value by the
// op log's window and is replicated, so the new master's tokens continue from it rather than
// from its own clock, and the next holder's FencedSet is not refused as stale. (The key used
// to go about a millisecond after its last token: the next token came out 2-3 s lower.)
func TestTokensRiseAcrossAFailoverToAReplicaWithAClockBehind(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{ReplicaClockOffset: "-3s"})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	master := cl.Nodes()[0]
	behind := cl.ReplicaOf(master)
	if behind != cl.Nodes()[len(cl.Masters())] {
		t.Fatal("the replica with the clock behind is not the first master's")
	}
	c := dlock.New(cc)
	defer c.Close(ctx)
	name := namesOn(t, cc, master, 1)[0]
	res := "res{" + name + "}"
	a, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := dlock.FencedSet(ctx, cc, res, "a", a.Token()); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Well past the token's microsecond: the key's old expiry, which Redis's active expiry
	// would have acted on by now.
	time.Sleep(300 * time.Millisecond)
	if err := cl.GracefulFailover(behind); err != nil {
		t.Fatal(err)
	}
	b, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unlock(ctx)
	err = dlock.FencedSet(ctx, cc, res, "b", b.Token())
	if b.Token() <= a.Token() || err != nil {
		t.Fatalf("across the failover: holder A's token %d, the next holder B's %d (%.3f s apart); B's FencedSet: %v (stale: %v)",
			a.Token(), b.Token(), (float64(b.Token())-float64(a.Token()))/1e6, err, errors.Is(err, dlock.ErrStaleToken))
	}
}
