package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// connection is where the CLI's Redis is, and the throwaway server behind it if it started one.
type connection struct {
	url    string
	opt    *redis.Options
	server *redisserver.Server
}

// connect resolves --redis / REDIS_URL. With neither and throwaway true, it starts a private
// redis-server in a temp dir (removed by close).
func connect(flagURL string, throwaway bool) (*connection, error) {
	url := flagURL
	if url == "" {
		url = os.Getenv("REDIS_URL")
	}
	if url == "" && throwaway {
		s, err := redisserver.Start(redisserver.Config{})
		if err != nil {
			return nil, hinted{err, "install redis-server (`apt-get install -y redis-server` on Debian) or point --redis / REDIS_URL at a running Redis"}
		}
		return &connection{url: s.URL(), opt: s.Options(), server: s}, nil
	}
	if url == "" {
		return nil, usageError{"no Redis given", "pass --redis URL or set REDIS_URL (redis://host:6379/0, rediss://..., unix:///path/redis.sock)"}
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, usageError{fmt.Sprintf("bad Redis URL %q: %v", url, err), "use redis://[user:pass@]host:port/db, rediss://... or unix:///path/redis.sock"}
	}
	c := &connection{url: url, opt: opt}
	rdb := c.client()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return nil, hinted{fmt.Errorf("cannot reach Redis at %s: %w", url, err), "check that Redis is running and the URL is right"}
	}
	return c, nil
}

func (c *connection) client() *redis.Client { return redis.NewClient(c.opt) }

func (c *connection) close() {
	if c.server != nil {
		c.server.Stop()
	}
}
