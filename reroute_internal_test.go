package dlock

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
)

// deadNodeRunner answers every call to node dead as a refused dial (a killed master the slot
// map still names, before any failover), and counts the calls.
type deadNodeRunner struct {
	dead  string
	calls atomic.Int32
}

func (r *deadNodeRunner) RunScripts(ctx context.Context, calls []ScriptCall) []ScriptResult {
	out := make([]ScriptResult, len(calls))
	for i := range calls {
		r.calls.Add(1)
		out[i] = ScriptResult{Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	}
	return out
}

// A batch (renewals, a MultiLock's releases) whose node refuses connections, before any
// failover, gives up after rerouteFor once for the whole batch, not once per call one after
// the other (found by review: 3 s for 5 calls).
func TestBatchOnADeadNodeGivesUpOnce(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := context.Background()
	victim := cl.Masters()[0].Addr
	var keys [][]string
	var args [][]any
	for i := 0; len(keys) < 5; i++ {
		k := "zz:" + strconv.Itoa(i)
		n, err := cc.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if n.Options().Addr == victim {
			keys, args = append(keys, []string{k}), append(args, []any{"h", int64(1000)})
		}
	}
	r := &deadNodeRunner{dead: victim}
	c := New(cc, WithScriptRunner(r))
	defer c.Close(ctx)
	start := time.Now()
	cmds := c.runBatch(ctx, scripts.Extend, keys, args)
	took := time.Since(start)
	t.Logf("batch of %d calls to a refusing node: %v (first error %v), runner calls %d", len(keys), took.Round(time.Millisecond), cmds[0].Err(), r.calls.Load())
	if took > 2*rerouteFor {
		t.Errorf("the batch waited %v: rerouteFor per call, serially", took.Round(time.Millisecond))
	}
}
