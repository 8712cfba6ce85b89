// Command dashshot draws docs/dashboard.png, the picture of dlockprom's Grafana dashboard
// (dashboard/dlock.json). It runs a small lock workload on a throwaway redis-server through
// dlock Clients observed by dlockprom, lets a real Prometheus server scrape them every second,
// then asks Prometheus for every panel's queries over the run (/api/v1/query_range) and plots
// the answers. So the picture shows what the dashboard's own queries return, not a mock-up.
//
//	cd dlockprom && go run ./internal/dashshot -out ../docs/dashboard.png
//
// It needs redis-server and prometheus in PATH (Debian: apt-get install -y redis-server
// prometheus) and takes about a minute and a half.
package main

import (
	"context"
	"flag"
	"fmt"
	"image/png"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/dlockprom"
	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func main() {
	out := flag.String("out", "dashboard.png", "the PNG to write")
	dash := flag.String("dashboard", "dashboard/dlock.json", "the Grafana dashboard whose panels to draw")
	dur := flag.Duration("duration", 75*time.Second, "how long the workload runs")
	step := flag.Duration("step", 2*time.Second, "the step of the range queries")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("dashshot: ")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, *out, *dash, *dur, *step)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// run does the work of main, returning (rather than exiting) on error so the deferred stops
// of redis-server and prometheus run.
func run(ctx context.Context, out, dash string, dur, step time.Duration) error {
	// The dashboard first: a wrong path should fail before a minute of workload, not after.
	panels, err := readDashboard(dash)
	if err != nil {
		return err
	}

	srv, err := redisserver.Start(redisserver.Config{})
	if err != nil {
		return err
	}
	defer srv.Stop()

	m := dlockprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	prom, err := startPrometheus(ctx, ln.Addr().String())
	if err != nil {
		return err
	}
	defer prom.stop()
	log.Printf("redis-server %s, metrics on http://%s/metrics, prometheus on http://%s (scrape every %v)",
		srv.Addr, ln.Addr(), prom.addr, scrapeInterval)

	log.Printf("workload: %v of contended Lock/Unlock, TryLock conflicts and forced releases", dur)
	start := time.Now()
	st := runWorkload(ctx, srv, m, dur)
	// The picture ends when the workload was due to stop: the shutdown after it (leases
	// unlocked for good, Clients closed) is not what the dashboard is about.
	end := start.Add(dur)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	log.Printf("workload done: %s", st)
	// Let the scrapes taken up to end reach Prometheus's storage before asking about them.
	time.Sleep(2 * scrapeInterval)

	var charts []chart
	for _, p := range panels {
		c := chart{title: p.Title, step: step.Seconds()}
		mixed := hasRate(p) && hasQuantile(p)
		for _, t := range p.Targets {
			expr := strings.ReplaceAll(t.Expr, "$job", "dlock") // the template variable, as Grafana would fill it
			series, err := prom.queryRange(ctx, expr, start, end, step)
			if err != nil {
				return fmt.Errorf("panel %q: %w", p.Title, err)
			}
			seconds := p.FieldConfig.Defaults.Unit == "s" || isQuantile(expr)
			unit := "count"
			switch {
			case seconds:
				unit = "seconds"
			case strings.Contains(expr, "rate("):
				unit = "per second"
			}
			points := 0
			for _, s := range series {
				points += s.points()
				c.lines = append(c.lines, line{
					label:   legend(t.Legend, expr, s.labels),
					unit:    unit,
					seconds: seconds,
					// A panel plotting rates and a latency quantile (the renewals panel) would
					// squash the latency flat against the rates' axis: it gets an axis of its own.
					right: mixed && seconds,
					t:     s.t, v: s.v,
				})
			}
			log.Printf("panel %q, %s: %d series, %d points", p.Title, t.RefID, len(series), points)
			if points == 0 {
				return fmt.Errorf("panel %q: query %s returned no data", p.Title, expr)
			}
		}
		charts = append(charts, c)
	}

	title := fmt.Sprintf("dlock dashboard (dlockprom/dashboard/dlock.json): each panel's queries over a %.0fs run, step %v",
		dur.Seconds(), step)
	img := drawDashboard(title, workloadSummary, charts, end.Sub(start).Seconds())
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	log.Printf("wrote %s (%dx%d)", out, img.Bounds().Dx(), img.Bounds().Dy())
	return nil
}

var quantileRE = regexp.MustCompile(`histogram_quantile\(\s*([0-9.]+)`)

func isQuantile(expr string) bool { return quantileRE.MatchString(expr) }

func hasQuantile(p panel) bool {
	for _, t := range p.Targets {
		if isQuantile(t.Expr) {
			return true
		}
	}
	return false
}

func hasRate(p panel) bool {
	for _, t := range p.Targets {
		if !isQuantile(t.Expr) && strings.Contains(t.Expr, "rate(") {
			return true
		}
	}
	return false
}

// legendRE matches a legendFormat's {{label}}.
var legendRE = regexp.MustCompile(`\{\{\s*\w+\s*\}\}`)

// legend names a series: by the target's legendFormat ("{{kind}} waiting") when it has one, as
// Grafana does, else as Grafana's default legend would, shorter: the quantile ("p99") and the
// values of the labels the query kept ("mutex Lock ok"); "all" for a bare sum.
func legend(format, expr string, labels map[string]string) string {
	if format != "" {
		return legendRE.ReplaceAllStringFunc(format, func(m string) string {
			return labels[strings.TrimSpace(m[2:len(m)-2])]
		})
	}
	var parts []string
	if m := quantileRE.FindStringSubmatch(expr); m != nil {
		q, _ := strconv.ParseFloat(m[1], 64)
		parts = append(parts, fmt.Sprintf("p%g", math.Round(q*1000)/10)) // 0.99: p99, 0.999: p99.9
	}
	parts = append(parts, values(labels)...)
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, " ")
}
