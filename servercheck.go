package dlock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// serverCheckTimeout bounds the start-up check of the server's settings.
const serverCheckTimeout = 5 * time.Second

// checkServer runs once per Client, in the background, when its first lease starts: it warns
// (WithLogger) when a Redis master may evict keys. An evicted lock key is a lock lost without
// any owner releasing it, so two owners can hold it; dlock needs maxmemory-policy noeviction
// (the default). A user without CONFIG permission only switches the check off, said once.
func (c *Client) checkServer() {
	c.checkOnce.Do(func() {
		if !c.goBackground() {
			return
		}
		go func() {
			defer c.wg.Done()
			ctx, cancel := context.WithTimeout(c.cleanup, serverCheckTimeout)
			defer cancel()
			check := func(ctx context.Context, node redis.UniversalClient) error {
				addr := "redis"
				if n, ok := node.(*redis.Client); ok {
					addr = n.Options().Addr
				}
				policy, err := node.ConfigGet(ctx, "maxmemory-policy").Result()
				switch {
				case err != nil:
					c.log.Info("dlock: cannot check the server's maxmemory-policy; make sure it is noeviction",
						"addr", addr, "err", err)
				case policy["maxmemory-policy"] != "" && policy["maxmemory-policy"] != "noeviction":
					c.log.Warn("dlock: Redis may evict lock keys: an evicted lock is released without its owner knowing, so two owners can hold it; set maxmemory-policy noeviction",
						"addr", addr, "maxmemory-policy", policy["maxmemory-policy"])
				}
				return nil
			}
			if cc, ok := c.rdb.(*redis.ClusterClient); ok {
				_ = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return check(ctx, n) })
				return
			}
			_ = check(ctx, c.rdb)
		}()
	})
}
