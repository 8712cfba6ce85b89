package redistest

import (
	"testing"

	"github.com/dlock-go/dlock/internal/redisserver"
)

// Cluster, ClusterConfig, SentinelGroup and SentinelConfig are redisserver's.
type (
	Cluster        = redisserver.Cluster
	ClusterConfig  = redisserver.ClusterConfig
	SentinelGroup  = redisserver.SentinelGroup
	SentinelConfig = redisserver.SentinelConfig
)

// StartClusterT starts a Redis Cluster for one test (redisserver.StartCluster) and stops it
// at cleanup. It fails the test (never skips) when the cluster cannot start.
func StartClusterT(t testing.TB, cfg ClusterConfig) *Cluster {
	t.Helper()
	c, err := redisserver.StartCluster(cfg)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// StartSentinelT starts a master, replicas and sentinels for one test
// (redisserver.StartSentinel) and stops them at cleanup. It fails the test (never skips)
// when the group cannot start.
func StartSentinelT(t testing.TB, cfg SentinelConfig) *SentinelGroup {
	t.Helper()
	g, err := redisserver.StartSentinel(cfg)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(g.Stop)
	return g
}
