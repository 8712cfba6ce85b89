package dlock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// A MultiLock's releases go out in one pipeline per node. Right after its members' Cluster
// master moved (a graceful failover, or a kill and the replica's promotion) the slot map may
// still name the old master: Unlock still releases every member on the new one.
func TestMultiLockUnlockRightAfterAClusterFailover(t *testing.T) {
	for _, tc := range []struct {
		what string
		move func(cl *redistest.Cluster, old *redistest.Server) *redistest.Server
	}{
		{"graceful", func(cl *redistest.Cluster, old *redistest.Server) *redistest.Server {
			r := cl.ReplicaOf(old)
			if err := cl.GracefulFailover(r); err != nil {
				t.Fatal(err)
			}
			return r
		}},
		{"kill", func(cl *redistest.Cluster, old *redistest.Server) *redistest.Server {
			r, _ := killReplicated(t, cl, old)
			return r
		}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
			cc := cl.Client()
			defer cc.Close()
			ctx := ctxT(t)
			dl := dlock.New(cc)
			defer dl.Close(ctx)
			old := cl.Masters()[0]
			names := namesOn(t, cc, old, 2)
			l, err := dl.MultiLock(names).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			promoted := tc.move(cl, old)
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("Unlock right after the move: %v", err)
			}
			admin := promoted.Client()
			defer admin.Close()
			for _, n := range names {
				if admin.Exists(ctx, lockKey(n)).Val() != 0 {
					t.Errorf("%s still held on the new master after Unlock returned nil", n)
				}
			}
		})
	}
}
