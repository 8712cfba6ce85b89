package dlockprom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMain(m *testing.M) {
	// Examples connect through REDIS_URL, as a program would; point it at the shared server.
	os.Exit(redistest.Main(m, func(s *redistest.Server) { os.Setenv("REDIS_URL", s.URL()) }))
}

// waitFor polls cond every 5ms for 5s (the watchdog's renewals, the loss push: events that
// come on their own time).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
	}
}

// use runs a Lock, a refused TryLock of another owner, renewals, an Unlock, a lost lease and
// a Close on a Client observed by m.
func use(t *testing.T, m *Metrics) {
	t.Helper()
	ctx := context.Background()
	rdb := redistest.Client(t)
	c := dlock.New(rdb, dlock.WithObserver(m.Observer()), dlock.WithTTL(200*time.Millisecond))
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex(name, dlock.WithoutCohort()).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock: %v", err)
	}
	waitFor(t, "a renewal", func() bool { return testutil.ToFloat64(m.renewals.WithLabelValues("ok")) > 0 })
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lost, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, dlock.DefaultKeyPrefix+"{"+name+"}").Err(); err != nil {
		t.Fatal(err)
	}
	<-lost.Done()
	held, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)
	<-held.Done()
}

// The metrics count what the Client did: calls by outcome, leases by how they ended, renewals.
func TestMetricsCountWhatTheClientDid(t *testing.T) {
	m := New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	use(t, m)
	for _, c := range []struct {
		what string
		got  prometheus.Collector
		want float64
	}{
		{"Lock ok", m.calls.WithLabelValues("mutex", "Lock", "ok"), 3},
		{"TryLock not obtained", m.calls.WithLabelValues("mutex", "TryLock", "not_obtained"), 1},
		{"Unlock ok", m.calls.WithLabelValues("mutex", "Unlock", "ok"), 1},
		{"leases acquired", m.acquired.WithLabelValues("mutex"), 3},
		{"leases unlocked", m.ended.WithLabelValues("unlocked"), 1},
		{"leases lost", m.ended.WithLabelValues("lost"), 1},
		{"leases closed", m.ended.WithLabelValues("closed"), 1},
	} {
		if got := testutil.ToFloat64(c.got); got != c.want {
			t.Errorf("%s: %v, want %v", c.what, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m, "dlock_lock_wait_seconds"); n != 2 {
		t.Errorf("lock_wait_seconds: %d series, want 2 (Lock ok, TryLock not_obtained)", n)
	}
	if n := testutil.CollectAndCount(m, "dlock_renewal_duration_seconds"); n != 1 {
		t.Errorf("renewal_duration_seconds: %d series, want 1", n)
	}
	if problems, err := testutil.CollectAndLint(m); err != nil || len(problems) > 0 {
		t.Errorf("metric names and help: %v %v", problems, err)
	}
}

// dlock_waiting counts the lock calls waiting now: up while a Lock waits for a held lock, down
// once it returns.
func TestWaitingCountsLockCallsInProgress(t *testing.T) {
	ctx := context.Background()
	m := New()
	rdb := redistest.Client(t)
	holder := dlock.New(rdb, dlock.WithoutCohort())
	defer holder.Close(ctx)
	c := dlock.New(rdb, dlock.WithObserver(m.Observer()))
	defer c.Close(ctx)
	name := redistest.Name(t)
	l, err := holder.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := c.Mutex(name).Lock(ctx)
		if err == nil {
			err = w.Unlock(ctx)
		}
		got <- err
	}()
	waiting := m.waiting.WithLabelValues("mutex")
	waitFor(t, "dlock_waiting at 1", func() bool { return testutil.ToFloat64(waiting) == 1 })
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock: %v", err)
	}
	if n := testutil.ToFloat64(waiting); n != 1 {
		t.Fatalf("a TryLock counted as waiting: %v", n)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(waiting); n != 0 {
		t.Fatalf("dlock_waiting %v after the Lock returned, want 0", n)
	}
}

// The series an alert on lost leases or failed renewals watches exist at 0 before any event,
// so rate() counts a service's first loss (a series born at 1 shows no increase).
func TestAlertSeriesStartAtZero(t *testing.T) {
	m := New()
	if n := testutil.CollectAndCount(m, "dlock_leases_ended_total"); n != 4 {
		t.Errorf("leases_ended_total: %d series before any event, want 4 (unlocked, lost, expired, closed)", n)
	}
	if n := testutil.CollectAndCount(m, "dlock_renewals_total"); n != 5 {
		t.Errorf("renewals_total: %d series before any event, want 5", n)
	}
	for _, end := range []string{"lost", "expired"} {
		if got := testutil.ToFloat64(m.ended.WithLabelValues(end)); got != 0 {
			t.Errorf("leases_ended_total{end=%q} = %v before any event", end, got)
		}
	}
}

// A real Prometheus server scrapes the metrics from an HTTP endpoint and answers a query for
// them over its HTTP API, as a deployment would see them.
func TestPrometheusServerScrapesTheMetrics(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("the prometheus server is needed (Debian: apt-get install prometheus; make test installs it)")
	}
	m := New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	use(t, m)
	target := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer target.Close()

	dir := t.TempDir()
	config := filepath.Join(dir, "prometheus.yml")
	u, _ := url.Parse(target.URL)
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: dlock\n    static_configs:\n      - targets: ['%s']\n", u.Host)
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	logf, _ := os.Create(filepath.Join(dir, "prometheus.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	}()

	query := `dlock_calls_total{kind="mutex",method="TryLock",outcome="not_obtained"}`
	deadline := time.Now().Add(60 * time.Second)
	for {
		v, err := queryValue(addr, query)
		if err == nil && v == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("query %s: %q, %v (want 1)", query, v, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Every query of the dashboard (dashboard/dlock.json) is valid PromQL over these series:
	// the server accepts it, and the lock-call panel has data.
	exprs := dashboardExprs(t)
	if len(exprs) < 6 {
		t.Fatalf("%d queries in the dashboard", len(exprs))
	}
	for _, e := range exprs {
		e = strings.ReplaceAll(e, "$job", "dlock")
		// A rate needs two scrapes in its window: the lock-call panel may take a second more.
		for {
			n, err := querySeries(addr, e)
			if err != nil {
				t.Errorf("dashboard query %s: %v", e, err)
			}
			if err != nil || n > 0 || !strings.Contains(e, "rate(dlock_calls_total") {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("dashboard query %s: no series", e)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// dashboardExprs returns the expr of every target of every panel of the dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("dashboard/dlock.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

// querySeries runs an instant query and returns how many series it answered, or the server's
// error.
func querySeries(addr, query string) (int, error) {
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Status, Error string
		Data          struct{ Result []json.RawMessage }
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, err
	}
	if body.Status != "success" {
		return 0, fmt.Errorf("%s: %s", body.Status, body.Error)
	}
	return len(body.Data.Result), nil
}

// freeAddr returns a loopback address with a port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// queryValue asks the Prometheus server at addr for an instant query's single value.
func queryValue(addr, query string) (string, error) {
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var body struct {
		Status string
		Data   struct {
			Result []struct {
				Value [2]any
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", err
	}
	if len(body.Data.Result) != 1 {
		return "", fmt.Errorf("%d series (status %s)", len(body.Data.Result), body.Status)
	}
	v, _ := body.Data.Result[0].Value[1].(string)
	return v, nil
}
