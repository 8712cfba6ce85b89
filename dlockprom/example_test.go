package dlockprom_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

// A service that locks per request and exposes dlock's metrics on /metrics for Prometheus to
// scrape; dashboard/dlock.json is a Grafana dashboard over them.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	m := dlockprom.New()
	prometheus.MustRegister(m)
	locks := dlock.New(rdb, dlock.WithObserver(m.Observer()))

	http.Handle("/metrics", promhttp.Handler())
	http.HandleFunc("/reports/{name}", func(w http.ResponseWriter, r *http.Request) {
		l, err := locks.Mutex("report:" + r.PathValue("name")).TryLock(r.Context())
		if err != nil {
			http.Error(w, "another instance is making it", http.StatusConflict)
			return
		}
		defer l.Unlock(r.Context())
		// ... make the report under l.Context() ...
	})
	log.Fatal(http.ListenAndServe(":8080", nil))
}

// New makes the metrics; its Observer feeds them. Here one Lock and one refused TryLock,
// read back as the calls counter Prometheus would scrape.
func ExampleNew() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL")) // in a real program: the client it already has
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	m := dlockprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	c := dlock.New(rdb, dlock.WithObserver(m.Observer()))
	defer c.Close(ctx)

	l, _ := c.Mutex("example:metrics").Lock(ctx)
	_, _ = c.Mutex("example:metrics", dlock.WithoutCohort()).TryLock(ctx) // another owner
	_ = l.Unlock(ctx)

	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() != "dlock_calls_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			var labels []string
			for _, p := range s.GetLabel() {
				labels = append(labels, p.GetValue())
			}
			fmt.Println(strings.Join(labels, " "), s.GetCounter().GetValue())
		}
	}
	// Output:
	// mutex Lock ok 1
	// mutex TryLock not_obtained 1
	// mutex Unlock ok 1
}
