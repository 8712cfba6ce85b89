// Package dlockprom exports what a dlock Client's locks do as Prometheus metrics: lock calls by
// outcome and how long they waited, how long leases were held and how they ended, and the
// watchdog's renewals. It is a module of its own, so users of dlock who do not use Prometheus
// never download its client library.
//
//	m := dlockprom.New()
//	prometheus.MustRegister(m)
//	c := dlock.New(rdb, dlock.WithObserver(m.Observer()))
//
// Lock names are not labels: a service that locks one name per user or order would make a
// series per name. The labels are the primitive (kind: mutex, rwmutex, semaphore, multilock),
// the method (Lock, TryLock, RLock, TryRLock, Acquire, TryAcquire, Unlock) and the outcome.
//
// The series, all prefixed dlock_:
//
//	calls_total{kind,method,outcome}             lock calls and Unlocks, by outcome
//	lock_wait_seconds{kind,method,outcome}       how long lock calls took (histogram)
//	waiting{kind}                                lock calls waiting now (Lock, RLock, Acquire): the Client's own queue
//	leases_acquired_total{kind}                  leases handed out by lock calls
//	leases_ended_total{end}                      leases ended: unlocked, lost, expired (a fixed lease's TTL), closed
//	lease_held_seconds{end}                      how long leases were held (histogram)
//	renewals_total{outcome}                      watchdog renewals: ok, lost (refused), not_replicated, unavailable, error
//	renewal_duration_seconds                     how long Redis took to answer a renewal (histogram)
//
// Outcomes are dlock.Outcome's: ok, not_obtained, not_held, closed, invalid, unavailable,
// error for calls.
package dlockprom

import (
	"context"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics collects a dlock Client's events (through the Observer it returns) as Prometheus
// metrics. It is a prometheus.Collector: register it once, and give its Observer to every
// Client whose locks it should count. It is safe for concurrent use.
type Metrics struct {
	calls    *prometheus.CounterVec
	wait     *prometheus.HistogramVec
	waiting  *prometheus.GaugeVec
	acquired *prometheus.CounterVec
	ended    *prometheus.CounterVec
	held     *prometheus.HistogramVec
	renewals *prometheus.CounterVec
	renewDur prometheus.Histogram
}

// New returns Metrics with the series listed in the package documentation, registered nowhere
// yet.
func New() *Metrics {
	const ns = "dlock"
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "calls_total",
			Help: "Lock calls and Unlocks, by primitive, method and outcome."}, []string{"kind", "method", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "lock_wait_seconds",
			Help:    "How long lock calls took (for Lock, how long the caller waited), by primitive, method and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}, []string{"kind", "method", "outcome"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "waiting",
			Help: "Lock calls waiting now (Lock, RLock, Acquire in progress), by primitive."}, []string{"kind"}),
		acquired: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "leases_acquired_total",
			Help: "Leases handed out by lock calls, by primitive."}, []string{"kind"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "leases_ended_total",
			Help: "Leases ended, by how: unlocked, lost or closed."}, []string{"end"}),
		held: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "lease_held_seconds",
			Help:    "How long leases were held, by how they ended.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}, []string{"end"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "renewals_total",
			Help: "Watchdog renewals of Redis holds, by outcome."}, []string{"outcome"}),
		renewDur: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "renewal_duration_seconds",
			Help:    "How long Redis took to answer a watchdog renewal.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 8)}),
	}
	// The series an alert watches exist at 0 from the start: rate() sees no increase in a
	// series' first sample, so without this a service's first lost lease would not count.
	for _, end := range []string{"unlocked", "lost", "expired", "closed"} {
		m.ended.WithLabelValues(end)
	}
	for _, outcome := range []string{"ok", "lost", "not_replicated", "unavailable", "error"} {
		m.renewals.WithLabelValues(outcome)
	}
	return m
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.calls, m.wait, m.waiting, m.acquired, m.ended, m.held, m.renewals, m.renewDur}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// Observer returns the dlock.Observer that feeds m: pass it to dlock.WithObserver. It only
// counts and observes, so it never holds up a lock call.
func (m *Metrics) Observer() dlock.Observer {
	return dlock.Observer{
		CallStart: func(ctx context.Context, call dlock.Call) context.Context {
			if waits(call) {
				m.waiting.WithLabelValues(call.Kind).Inc()
			}
			return ctx
		},
		CallDone: func(_ context.Context, call dlock.Call, res dlock.CallResult) {
			if waits(call) {
				m.waiting.WithLabelValues(call.Kind).Dec()
			}
			outcome := dlock.Outcome(res.Err)
			m.calls.WithLabelValues(call.Kind, call.Method, outcome).Inc()
			if call.Method == "Unlock" {
				return
			}
			m.wait.WithLabelValues(call.Kind, call.Method, outcome).Observe(time.Since(call.Start).Seconds())
			if res.Err == nil && res.Lease != nil {
				m.acquired.WithLabelValues(call.Kind).Inc()
			}
		},
		LeaseEnded: func(e dlock.LeaseEnd) {
			end := "unlocked"
			if e.Err != nil {
				end = dlock.Outcome(e.Err) // lost, expired, closed
			}
			m.ended.WithLabelValues(end).Inc()
			m.held.WithLabelValues(end).Observe(e.Held.Seconds())
		},
		Renewed: func(r dlock.Renewal) {
			outcome := dlock.Outcome(r.Err) // ok, lost (refused), not_replicated, unavailable, error
			m.renewals.WithLabelValues(outcome).Inc()
			if r.Err == nil {
				m.renewDur.Observe(r.Latency.Seconds())
			}
		},
	}
}

// waits reports whether call is one that waits for its lock (a TryLock or an Unlock does not).
func waits(call dlock.Call) bool {
	return call.Method == "Lock" || call.Method == "RLock" || call.Method == "Acquire"
}
