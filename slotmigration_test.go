package dlock_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// rejectedHGETALLs is how many HGETALLs the server refused so far (an error reply: ASK, MOVED,
// NOPERM, ...), from INFO commandstats.
func rejectedHGETALLs(t *testing.T, c *redis.Client) int {
	info := c.Info(ctxT(t), "commandstats").Val()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "cmdstat_hgetall:"); ok {
			for _, f := range strings.Split(v, ",") {
				if x, ok := strings.CutPrefix(f, "rejected_calls="); ok {
					n, _ := strconv.Atoi(x)
					return n
				}
			}
		}
	}
	return 0
}

// A slot being migrated (resharding): the held key moved to the importing node and the
// tracking read on the source answers ASK, which is no answer about the key. A DEL of the key on
// the target is still found within about a second, confirmed through the main client, which
// follows ASK (found by review; issue 9, point 2).
func TestAskDuringSlotMigrationMissesNoLoss(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{Replicas: -1})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	dl := dlock.New(cc) // TTL 30s: renewal every 10s
	defer dl.Close(ctx)
	name := redistest.Name(t)
	key := lockKey(name)
	l, err := dl.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	<-dlock.Tracked(l)
	mig, err := cl.MigrateSlotOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	sc, dc := mig.Src.Client(), mig.Dst.Client()
	defer sc.Close()
	defer dc.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if l.Err() != nil {
		t.Fatalf("false loss during the migration: %v", l.Err())
	}
	before := rejectedHGETALLs(t, sc)
	// Taken from under the lease on the importing node.
	cn := dc.Conn()
	defer cn.Close()
	must(cn.Do(ctx, "ASKING").Err())
	must(cn.Do(ctx, "DEL", key).Err())
	del := time.Now()
	select {
	case <-l.Done():
		t.Logf("loss reported %v after the DEL: %v", time.Since(del).Round(time.Millisecond), l.Err())
	case <-time.After(12 * time.Second):
		t.Errorf("missed loss: lease still held 12s after its key was deleted on the importing node")
	}
	if took := time.Since(del); took > 1500*time.Millisecond {
		t.Errorf("missed loss: reported %v after the DEL", took.Round(time.Millisecond))
	}
	t.Logf("HGETALLs rejected (ASK) by the source node meanwhile: %d", rejectedHGETALLs(t, sc)-before)
}
