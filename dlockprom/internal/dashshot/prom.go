package main

// The Prometheus side: the dashboard's panels, a prometheus server scraping the workload, and
// its range-query API. The server is started as dlockprom_test.go starts it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

var errNoPrometheus = errors.New("prometheus not found in PATH: install it (Debian: apt-get install -y prometheus)")

// scrapeInterval is short so a run of a minute or so gives dozens of samples per series.
const scrapeInterval = time.Second

// A panel is what dashshot reads of a Grafana panel.
type panel struct {
	Title       string
	FieldConfig struct {
		Defaults struct{ Unit string }
	}
	Targets []struct {
		RefID  string `json:"refId"`
		Legend string `json:"legendFormat"`
		Expr   string
	}
}

func readDashboard(path string) ([]panel, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct{ Panels []panel }
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(d.Panels) == 0 {
		return nil, fmt.Errorf("%s: no panels", path)
	}
	return d.Panels, nil
}

// promServer is a prometheus process with its own config and data in a temp dir.
type promServer struct {
	addr string // host:port of its web API
	dir  string
	cmd  *exec.Cmd
}

// startPrometheus starts prometheus scraping target's /metrics every scrapeInterval, as job
// "dlock" (what the dashboard's $job selects), and returns once it has scraped it once.
func startPrometheus(ctx context.Context, target string) (*promServer, error) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		return nil, errNoPrometheus
	}
	dir, err := os.MkdirTemp("", "dashshot-prometheus-")
	if err != nil {
		return nil, err
	}
	p := &promServer{dir: dir}
	cfg := fmt.Sprintf("global:\n  scrape_interval: %v\nscrape_configs:\n  - job_name: dlock\n    static_configs:\n      - targets: ['%s']\n",
		scrapeInterval, target)
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		p.stop()
		return nil, err
	}
	if p.addr, err = freeAddr(); err != nil {
		p.stop()
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		p.stop()
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	p.cmd = exec.CommandContext(ctx, bin, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+p.addr)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		p.stop()
		return nil, err
	}
	// Ready and scraping: up{job="dlock"} is 1 once a scrape of the target succeeded.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if s, err := p.query(ctx, "/api/v1/query", url.Values{"query": {`up{job="dlock"}`}}); err == nil &&
			len(s) == 1 && s[0].points() == 1 && s[0].v[0] == 1 {
			return p, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			p.stop()
			return nil, fmt.Errorf("prometheus did not scrape %s within 60s; its log:\n%s", target, b)
		}
	}
}

// stop kills prometheus and removes its directory.
func (p *promServer) stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	_ = os.RemoveAll(p.dir)
}

// A series is one series of a query's answer: its labels and its points, t in seconds since
// the range's start.
type series struct {
	labels map[string]string
	t, v   []float64
}

func (s series) points() int { return len(s.t) }

// queryRange runs expr over [start, end] every step, as a Grafana time-series panel does.
func (p *promServer) queryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]series, error) {
	ss, err := p.query(ctx, "/api/v1/query_range", url.Values{
		"query": {expr},
		"start": {unix(start)},
		"end":   {unix(end)},
		"step":  {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
	})
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	t0 := float64(start.UnixMilli()) / 1e3
	for i := range ss {
		for j := range ss[i].t {
			ss[i].t[j] -= t0
		}
	}
	return ss, nil
}

func unix(t time.Time) string { return strconv.FormatFloat(float64(t.UnixMilli())/1e3, 'f', 3, 64) }

// query calls an endpoint of the query API and returns its series (an instant vector's
// samples as one-point series). Values Prometheus cannot give, as a histogram_quantile of no
// observations (NaN), stay in as NaN: the chart leaves a gap there.
func (p *promServer) query(ctx context.Context, path string, params url.Values) ([]series, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path+"?"+params.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status, Error string
		Data          struct {
			Result []struct {
				Metric map[string]string
				Value  []any   // instant query: [time, "value"]
				Values [][]any // range query: [[time, "value"], ...]
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("%s: %s", body.Status, body.Error)
	}
	var out []series
	for _, r := range body.Data.Result {
		s := series{labels: r.Metric}
		if r.Value != nil {
			r.Values = append(r.Values, r.Value)
		}
		for _, tv := range r.Values {
			t, _ := tv[0].(float64)
			vs, _ := tv[1].(string)
			v, err := strconv.ParseFloat(vs, 64) // "NaN", "+Inf" parse too
			if err != nil {
				v = math.NaN()
			}
			s.t, s.v = append(s.t, t), append(s.v, v)
		}
		out = append(out, s)
	}
	// Prometheus answers in no particular order: sort by legend, so colours stay put between runs.
	slices.SortFunc(out, func(a, b series) int {
		return strings.Compare(strings.Join(values(a.labels), " "), strings.Join(values(b.labels), " "))
	})
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func values(m map[string]string) []string {
	var vs []string
	for _, k := range sortedKeys(m) {
		vs = append(vs, m[k])
	}
	return vs
}

// freeAddr returns a loopback address with a port nobody listens on.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
