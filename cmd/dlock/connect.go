package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// connection is where the CLI's Redis is, and the throwaway server behind it if it started one.
type connection struct {
	url    string
	rdb    redis.UniversalClient
	server *redisserver.Server
}

const urlHint = "use redis://[user:pass@]host:port/db, rediss://... (TLS), unix:///path/redis.sock, " +
	"redis+cluster://host:port?addr=host2:port2 or redis+sentinel://host:26379?master_name=NAME"

// connect resolves --redis / REDIS_URL and checks that Redis answers. With neither set and
// throwaway true, it starts a private redis-server in a temp dir (removed by close).
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
		return &connection{url: s.URL(), rdb: s.Client(), server: s}, nil
	}
	if url == "" {
		return nil, usageError{"no Redis given", "pass --redis URL or set REDIS_URL (" + urlHint + ")"}
	}
	rdb, err := openURL(url)
	if err != nil {
		return nil, usageError{fmt.Sprintf("bad Redis URL %q: %v", url, err), urlHint}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, hinted{fmt.Errorf("cannot reach Redis at %s: %w", url, err), "check that Redis is running and the URL is right"}
	}
	return &connection{url: url, rdb: rdb}, nil
}

// openURL makes a client for a redis://, rediss://, unix://, redis+cluster:// or
// redis+sentinel:// URL.
func openURL(url string) (redis.UniversalClient, error) {
	switch {
	case strings.HasPrefix(url, "redis+cluster://"), strings.HasPrefix(url, "rediss+cluster://"):
		opt, err := redis.ParseClusterURL(strings.Replace(url, "+cluster", "", 1))
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(opt), nil
	case strings.HasPrefix(url, "redis+sentinel://"), strings.HasPrefix(url, "rediss+sentinel://"):
		opt, err := redis.ParseFailoverURL(strings.Replace(url, "+sentinel", "", 1))
		if err != nil {
			return nil, err
		}
		return redis.NewFailoverClient(opt), nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opt), nil
}

func (c *connection) close() {
	_ = c.rdb.Close()
	if c.server != nil {
		c.server.Stop()
	}
}
