package dlockrueidis_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/rueidis"
)

// recording runs scripts through a runner and records each call's node, ASKING flag and error.
type recording struct {
	r   dlock.ScriptRunner
	mu  sync.Mutex
	log []string
}

func (r *recording) RunScripts(ctx context.Context, calls []dlock.ScriptCall) []dlock.ScriptResult {
	res := r.r.RunScripts(ctx, calls)
	r.mu.Lock()
	for i, c := range calls {
		e := "ok"
		if i < len(res) && res[i].Err != nil {
			e = res[i].Err.Error()
		}
		r.log = append(r.log, c.Node+" asking="+map[bool]string{true: "1", false: "0"}[c.Asking]+" -> "+e)
	}
	r.mu.Unlock()
	return res
}

// followed reports whether a recorded call got a reply containing redirect and a later one
// ended with then.
func followed(calls []string, redirect, then string) bool {
	for i, c := range calls {
		if strings.Contains(c, "-> "+redirect) {
			for _, d := range calls[i+1:] {
				if strings.HasSuffix(d, then) {
					return true
				}
			}
		}
	}
	return false
}

func (r *recording) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.log
	r.log = nil
	return l
}

// TestAskAndMovedAreFollowed: on a Cluster each script goes to the node go-redis maps its lock
// to; during a slot migration that node answers ASK and dlock sends the call to the target
// with ASKING; after it, MOVED, and dlock follows it. Both calls succeed.
func TestAskAndMovedAreFollowed(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{Replicas: -1})
	cc := cl.Client()
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cl.Addrs(), DisableCache: true, DisableRetry: true, AlwaysPipelining: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rec := &recording{r: dlockrueidis.RunnerFor(cc, rc)}
	c := dlock.New(cc, dlock.WithScriptRunner(rec))
	defer c.Close(ctx)
	name := redistest.Name(t)
	key := dlock.DefaultKeyPrefix + "{" + name + "}"
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec.take()
	mig, err := cl.MigrateSlotOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	err = l.Extend(ctx, 30*time.Second) // extend.lua touches the lock key alone: ASK
	calls := rec.take()
	t.Logf("Extend during migration: %v, calls %q", err, calls)
	if err != nil {
		t.Errorf("Extend: %v", err)
	}
	if !followed(calls, "ASK ", "asking=1 -> ok") {
		t.Errorf("Extend during the migration did not get ASK and succeed on the target with ASKING: %q", calls)
	}

	if err := mig.Finish(ctx); err != nil { // every key of the slot to dst, the slot dst's everywhere
		t.Fatal(err)
	}
	err = l.Unlock(ctx) // go-redis still maps the slot to src: MOVED
	calls = rec.take()
	t.Logf("Unlock after migration: %v, calls %q", err, calls)
	if err != nil {
		t.Errorf("Unlock: %v", err)
	}
	if !followed(calls, "MOVED ", "asking=0 -> ok") {
		t.Errorf("Unlock after the migration did not get MOVED and succeed on the new master: %q", calls)
	}
	dc := mig.Dst.Client()
	defer dc.Close()
	if n := dc.Exists(ctx, key).Val(); n != 0 {
		t.Errorf("lock key still on dst after Unlock")
	}
}
