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

// A Cluster client that sends reads to replicas (ReadOnly; RouteByLatency and RouteRandomly
// imply it) is common in applications that scale reads; dlock then reads its own state on the
// masters: a lagging replica's answer could open a latch nobody counted down, or end a lease
// as lost while the master holds it. No dlock read reaches a replica: not Latch.Count and
// Wait, not Semaphore.Available, not the confirming read of a lease that looks lost.
func TestClusterReplicaReadsStayOnTheMasters(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	ro := cl.Client(func(o *redis.ClusterOptions) { o.ReadOnly = true })
	defer ro.Close()
	ctx := ctxT(t)
	replicaReads(t, cl, ro)
	c := dlock.New(ro)
	defer c.Close(ctx)
	rw := cl.Client()
	defer rw.Close()
	admin := dlock.New(rw)
	defer admin.Close(ctx)
	name := redistest.Name(t)

	d := c.Latch(name + "-latch")
	if _, err := d.TrySetCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Count(ctx); n != 1 || err != nil {
		t.Fatalf("Count = %d, %v; want 1", n, err)
	}
	if err := d.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	s := c.Semaphore(name+"-sem", 2)
	p, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.Available(ctx); n != 1 || err != nil {
		t.Fatalf("Available = %d, %v; want 1", n, err)
	}
	_ = p.Unlock(ctx)
	// A lease whose key the tracking push says changed: confirmed (or not) by a read.
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	<-dlock.Tracked(l)
	if _, err := admin.ForceRelease(ctx, name); err != nil {
		t.Fatal(err)
	}
	<-l.Done()

	for _, r := range cl.Replicas() {
		rdb := r.Client()
		stats := rdb.Info(context.Background(), "commandstats").Val()
		_ = rdb.Close()
		for _, cmd := range []string{"hmget", "hgetall", "exists", "hget"} {
			if strings.Contains(stats, "cmdstat_"+cmd+":") {
				t.Errorf("replica %s served %s: %s", r.Addr, strings.ToUpper(cmd), line(stats, "cmdstat_"+cmd+":"))
			}
		}
	}
}

// replicaReads makes sure ro sends reads to replicas: a Cluster lists a replica in CLUSTER
// SLOTS only once its replication offset is above 0 (a write on its master), and a client
// picks it up when it reloads the slot map. The replicas' command counts are then reset.
func replicaReads(t *testing.T, cl *redistest.Cluster, ro *redis.ClusterClient) {
	t.Helper()
	ctx := ctxT(t)
	for i := range 64 { // a write on every master, but for a chance of 3 × (2/3)^64
		if err := ro.Set(ctx, "replicated"+strconv.Itoa(i), 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Every node must list the replicas (gossip spreads their offsets), as the client reloads
	// the map from any one of them.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		listed := true
		for _, n := range cl.Nodes() {
			rdb := n.Client()
			slots, err := rdb.ClusterSlots(ctx).Result()
			_ = rdb.Close()
			listed = listed && err == nil && len(slots) > 0
			for _, s := range slots {
				listed = listed && len(s.Nodes) > 1
			}
		}
		if listed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("replicas not listed in every node's CLUSTER SLOTS after 20 s")
		}
	}
	// ReloadState is lazy (the next command loads the map, in the background): ask again until
	// a read reaches a replica.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ro.ReloadState(ctx)
		for i := range 16 {
			ro.Get(ctx, "probe"+strconv.Itoa(i))
		}
		reached := false
		for _, r := range cl.Replicas() {
			rdb := r.Client()
			reached = reached || strings.Contains(rdb.Info(ctx, "commandstats").Val(), "cmdstat_get:")
			_ = rdb.Close()
		}
		if reached {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a ReadOnly client's GETs reached no replica in 20 s")
		}
	}
	for _, r := range cl.Replicas() {
		rdb := r.Client()
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		_ = rdb.Close()
	}
}

// line returns the line of s that starts with prefix.
func line(s, prefix string) string {
	for _, l := range strings.Split(s, "\r\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
