package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestLockedVariants runs a small sale (100 users × 3 clicks, 50 items) through dlock and
// pgforupdate and requires a correct result from each. PostgreSQL needs root to start, so the
// test only runs with PG_URL set: `bash examples/flashsale/run.sh test` starts one for it.
func TestLockedVariants(t *testing.T) {
	pgURL := os.Getenv("PG_URL")
	if pgURL == "" {
		t.Skip("PG_URL is not set: this test needs a PostgreSQL; run `bash examples/flashsale/run.sh test` (as root) to start a throwaway one")
	}
	cfg := Config{PGURL: pgURL, RedisURL: os.Getenv("REDIS_URL"), Items: 50, Seed: 1,
		Load: Load{Users: 100, Clicks: 3, Workers: 30, Window: 10}}
	if cfg.RedisURL == "" {
		s, err := redisserver.Start(redisserver.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		cfg.RedisURL, cfg.FlushDB = s.URL(), true
	}
	for _, v := range []string{"dlock", "pgforupdate"} {
		t.Run(v, func(t *testing.T) {
			r, err := RunVariant(context.Background(), cfg, v)
			if err != nil {
				t.Fatal(err)
			}
			if p := r.Problems(); len(p) > 0 {
				t.Fatalf("%s: %s", v, strings.Join(p, "; "))
			}
			if r.Audit.Orders != cfg.Items || r.Audit.StockLeft != 0 {
				t.Fatalf("%s: %d orders, %d left; want all %d items sold to distinct users", v, r.Audit.Orders, r.Audit.StockLeft, cfg.Items)
			}
			t.Logf("%s: %.0f req/s, p99 %v, %d orders, statuses %v", v, r.Report.ReqPerS, r.Report.Metrics.Latencies.P99, r.Audit.Orders, r.Report.Statuses)
		})
	}
}

// TestFenceRefusesOlderToken checks the fence on its own: once a token is recorded for a
// user, an order carrying an older or equal token is refused, a newer one goes through.
func TestFenceRefusesOlderToken(t *testing.T) {
	pgURL := os.Getenv("PG_URL")
	if pgURL == "" {
		t.Skip("PG_URL is not set: this test needs a PostgreSQL; run `bash examples/flashsale/run.sh test` (as root) to start a throwaway one")
	}
	ctx := context.Background()
	db, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "DELETE FROM flashsale.user_tokens WHERE user_id = -1"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token int64
		want  error
	}{{10, nil}, {5, errLost}, {10, errLost}, {11, nil}} {
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := fence(ctx, tx, -1, c.token); !errors.Is(err, c.want) {
			t.Errorf("token %d: fence = %v, want %v", c.token, err, c.want)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
