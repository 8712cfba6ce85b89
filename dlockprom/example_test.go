package dlockprom_test

import (
	"log"
	"net/http"

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
