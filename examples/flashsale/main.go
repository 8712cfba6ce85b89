// Command flashsale sells a few hundred items to a crowd of users who each click "buy"
// several times at once, through a real HTTP service (Redis stock, PostgreSQL orders) driven
// by vegeta, once per lock variant: none, dlock, redsync, redislock and pgforupdate. It
// prints a markdown table of throughput, latency and what the sale left behind: orders,
// stock, oversell and users who got two orders.
//
//	bash examples/flashsale/run.sh            # throwaway PostgreSQL and Redis, all variants
//	PG_URL=postgres://... [REDIS_URL=redis://...] go run . -variants dlock,none
//
// Without REDIS_URL it starts a throwaway redis-server. PG_URL is required; its tables go in
// a schema "flashsale", truncated before each variant.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Config is one sale's setting, shared by every variant.
type Config struct {
	PGURL    string
	RedisURL string
	Items    int
	Load     Load
	Seed     uint64 // the click order: the same for every variant
	FlushDB  bool   // the Redis is our own: empty it before each variant
}

// Result is one variant's run.
type Result struct {
	Variant string
	Fenced  bool // orders carry a fencing token the database checks
	Report  Report
	Audit   Audit
	Items   int
}

// Problems lists what went wrong, empty for a correct sale: an item sold twice or lost
// (orders + stock left must be the items put on sale), a user with two orders, an HTTP 200
// without its order or the reverse, or requests that failed (503 or a transport error).
func (r Result) Problems() []string {
	var p []string
	a := r.Audit
	if !a.Conserved(r.Items) {
		p = append(p, fmt.Sprintf("oversold: %d orders (%d distinct items) + %d left != %d", a.Orders, a.Items, a.StockLeft, r.Items))
	}
	if a.Doubles > 0 {
		p = append(p, fmt.Sprintf("%d users with 2+ orders", a.Doubles))
	}
	if ok := r.Report.Statuses[200]; ok != a.Orders {
		p = append(p, fmt.Sprintf("%d answered 200 but %d orders", ok, a.Orders))
	}
	if n := r.Report.Statuses[503] + r.Report.Statuses[0]; n > 0 {
		p = append(p, fmt.Sprintf("%d requests failed (%v)", n, r.Report.Metrics.Errors))
	}
	return p
}

func main() {
	cfg := Config{PGURL: os.Getenv("PG_URL"), RedisURL: os.Getenv("REDIS_URL"), Seed: 14}
	variants := flag.String("variants", strings.Join(Variants, ","), "comma-separated variants to run")
	flag.IntVar(&cfg.Items, "items", 500, "items on sale")
	flag.IntVar(&cfg.Load.Users, "users", 1000, "virtual users")
	flag.IntVar(&cfg.Load.Clicks, "clicks", 5, "buy clicks per user")
	flag.IntVar(&cfg.Load.Workers, "workers", 100, "requests in flight at once (vegeta workers)")
	flag.IntVar(&cfg.Load.Window, "window", 20, "users whose clicks are shuffled together")
	flag.Parse()
	if err := run(cfg, strings.Split(*variants, ","), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "flashsale:", err)
		os.Exit(1)
	}
}

// run runs every variant and prints the table; it fails when a locked variant got it wrong.
func run(cfg Config, variants []string, out io.Writer) error {
	if cfg.PGURL == "" {
		return fmt.Errorf("PG_URL is not set: run `bash examples/flashsale/run.sh`, which starts a throwaway PostgreSQL")
	}
	if cfg.RedisURL == "" {
		s, err := redisserver.Start(redisserver.Config{})
		if err != nil {
			return err
		}
		defer s.Stop()
		cfg.RedisURL, cfg.FlushDB = s.URL(), true
	}
	fmt.Fprintf(out, "Flash sale: %d items, %d users × %d clicks = %d POST /buy, %d in flight (vegeta), GOMAXPROCS %d\n\n",
		cfg.Items, cfg.Load.Users, cfg.Load.Clicks, cfg.Load.Users*cfg.Load.Clicks, cfg.Load.Workers, runtime.GOMAXPROCS(0))
	var results []Result
	for _, v := range variants {
		r, err := RunVariant(context.Background(), cfg, v)
		if err != nil {
			return fmt.Errorf("%s: %w", v, err)
		}
		results = append(results, r)
	}
	printTable(out, results)
	var failed []string
	for _, r := range results {
		if r.Variant != "none" && len(r.Problems()) > 0 {
			failed = append(failed, r.Variant)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("locked variants got it wrong: %s", strings.Join(failed, ", "))
	}
	return nil
}

// RunVariant sells cfg.Items to cfg.Load through a fresh service guarded by variant.
func RunVariant(ctx context.Context, cfg Config, variant string) (Result, error) {
	res := Result{Variant: variant, Items: cfg.Items}
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return res, fmt.Errorf("REDIS_URL: %w", err)
	}
	opt.PoolSize = 2 * cfg.Load.Workers // room for every click's lock and stock calls at once
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if cfg.FlushDB {
		if err := rdb.FlushDB(ctx).Err(); err != nil {
			return res, err
		}
	}
	pcfg, err := pgxpool.ParseConfig(cfg.PGURL)
	if err != nil {
		return res, fmt.Errorf("PG_URL: %w", err)
	}
	pcfg.MaxConns = 50 // below max_connections; clicks beyond it queue for a connection
	db, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, err
	}
	defer db.Close()
	if err := Setup(ctx, db); err != nil {
		return res, fmt.Errorf("schema: %w", err)
	}
	guard, err := NewGuard(variant, rdb)
	if err != nil {
		return res, err
	}
	defer guard.Close()
	res.Fenced = variant == "dlock" // the only lock here with a fencing token
	svc := &Service{DB: db, RDB: rdb, Guard: guard, StockKey: "flashsale:stock", LockWait: 10 * time.Second}
	if err := svc.Reset(ctx, cfg.Items); err != nil {
		return res, err
	}
	srv := httptest.NewServer(svc) // a real listener on 127.0.0.1
	res.Report = Attack(srv.URL, cfg.Load, cfg.Seed)
	srv.Close()
	res.Audit, err = svc.Audit(ctx)
	return res, err
}

// printTable prints the results as a markdown table and the problems under it.
func printTable(out io.Writer, results []Result) {
	fmt.Fprintln(out, "| variant | fenced | req/s | p50 | p99 | 200 / 409 / 410 / 503 | orders | stock left | orders + stock = items | users with ≥2 orders | result |")
	fmt.Fprintln(out, "|---|---|--:|--:|--:|---|--:|--:|---|--:|---|")
	for _, r := range results {
		m, s, a := r.Report.Metrics, r.Report.Statuses, r.Audit
		verdict := "PASS"
		if len(r.Problems()) > 0 {
			verdict = "FAIL"
		}
		if r.Variant == "none" {
			verdict += " (no lock: expected to fail)"
		}
		conserved := "yes"
		if !a.Conserved(r.Items) {
			conserved = "NO"
		}
		fmt.Fprintf(out, "| %s | %s | %.0f | %s | %s | %d / %d / %d / %d | %d | %d | %s (%d + %d) | %d | %s |\n",
			r.Variant, yesNo(r.Fenced), r.Report.ReqPerS, ms(m.Latencies.P50), ms(m.Latencies.P99),
			s[200], s[409], s[410], s[503]+s[0], a.Orders, a.StockLeft, conserved, a.Orders, a.StockLeft,
			a.Doubles, verdict)
	}
	fmt.Fprintln(out)
	for _, r := range results {
		if p := r.Problems(); len(p) > 0 {
			fmt.Fprintf(out, "%s: %s\n", r.Variant, strings.Join(p, "; "))
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// ms prints a latency in milliseconds with two decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }
