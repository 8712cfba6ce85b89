// Package dlockotel reports what a dlock Client's locks do through OpenTelemetry: a span
// around each lock call and Unlock, and metrics through the OTel metrics API. It is a module
// of its own, so users of dlock who do not use OpenTelemetry never download it.
//
//	o, err := dlockotel.New() // the global TracerProvider and MeterProvider
//	if err != nil { ... }
//	c := dlock.New(rdb, dlock.WithObserver(o))
//
// Spans are named "dlock.<Method>" (dlock.Lock, dlock.TryLock, dlock.RLock, dlock.Acquire,
// dlock.Unlock, ...) and carry dlock.lock.name, dlock.lock.kind, dlock.outcome (see
// dlock.Outcome) and, when a lease was handed out, dlock.lease.token. A span's status is Error
// only when the call failed for a reason other than the lock being taken (not_obtained is an
// answer, not a failure). The span is the call's context, so the call's Redis commands (traced
// by redisotel on the user's client) are its children.
//
// Metrics (names by OTel conventions, seconds for durations):
//
//	dlock.lock.wait         histogram, s: how long lock calls took, by dlock.lock.kind, dlock.method, dlock.outcome
//	dlock.calls             counter: lock calls and Unlocks, by the same attributes
//	dlock.lock.waiting      up-down counter: lock calls waiting now (Lock, RLock, Acquire), by dlock.lock.kind
//	dlock.lease.held        histogram, s: how long leases were held, by dlock.lease.end (unlocked, lost, expired, closed)
//	dlock.renewals          counter: watchdog renewals, by dlock.outcome
//	dlock.renewal.duration  histogram, s: how long Redis took to answer a renewal
//
// Lock names are span attributes but not metric attributes: one time series per user or order
// would be one too many.
package dlockotel

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-go/dlock"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// scope is the instrumentation scope dlockotel's tracer and meter are named by.
const scope = "github.com/dlock-go/dlock/dlockotel"

// An Option configures New.
type Option func(*config)

type config struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
}

// WithTracerProvider sets the TracerProvider spans are made with (default: otel's global one).
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithMeterProvider sets the MeterProvider metrics are made with (default: otel's global one).
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// New returns a dlock.Observer that reports through OpenTelemetry: give it to dlock.WithObserver.
// It fails only when the meter refuses to make an instrument.
func New(opts ...Option) (dlock.Observer, error) {
	cfg := config{tp: otel.GetTracerProvider(), mp: otel.GetMeterProvider()}
	for _, o := range opts {
		o(&cfg)
	}
	tracer := cfg.tp.Tracer(scope)
	meter := cfg.mp.Meter(scope)
	var errs []error
	mk := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	wait, err := meter.Float64Histogram("dlock.lock.wait", metric.WithUnit("s"),
		metric.WithDescription("How long lock calls took (for Lock, how long the caller waited)."))
	mk(err)
	calls, err := meter.Int64Counter("dlock.calls", metric.WithDescription("Lock calls and Unlocks, by outcome."))
	mk(err)
	waiting, err := meter.Int64UpDownCounter("dlock.lock.waiting",
		metric.WithDescription("Lock calls waiting now (Lock, RLock, Acquire in progress), by primitive."))
	mk(err)
	held, err := meter.Float64Histogram("dlock.lease.held", metric.WithUnit("s"),
		metric.WithDescription("How long leases were held, by how they ended."))
	mk(err)
	renewals, err := meter.Int64Counter("dlock.renewals", metric.WithDescription("Watchdog renewals of Redis holds, by outcome."))
	mk(err)
	renewDur, err := meter.Float64Histogram("dlock.renewal.duration", metric.WithUnit("s"),
		metric.WithDescription("How long Redis took to answer a watchdog renewal."))
	mk(err)
	if err := errors.Join(errs...); err != nil {
		return dlock.Observer{}, err
	}
	return dlock.Observer{
		CallStart: func(ctx context.Context, call dlock.Call) context.Context {
			if waits(call) {
				waiting.Add(ctx, 1, metric.WithAttributes(attribute.String("dlock.lock.kind", call.Kind)))
			}
			ctx, _ = tracer.Start(ctx, "dlock."+call.Method, trace.WithTimestamp(call.Start),
				trace.WithSpanKind(trace.SpanKindInternal),
				trace.WithAttributes(attribute.String("dlock.lock.name", call.Name), attribute.String("dlock.lock.kind", call.Kind)))
			return ctx
		},
		CallDone: func(ctx context.Context, call dlock.Call, res dlock.CallResult) {
			if waits(call) {
				waiting.Add(ctx, -1, metric.WithAttributes(attribute.String("dlock.lock.kind", call.Kind)))
			}
			l, err := res.Lease, res.Err
			outcome := dlock.Outcome(err)
			attrs := metric.WithAttributes(attribute.String("dlock.lock.kind", call.Kind),
				attribute.String("dlock.method", call.Method), attribute.String("dlock.outcome", outcome))
			calls.Add(ctx, 1, attrs)
			if call.Method != "Unlock" {
				wait.Record(ctx, time.Since(call.Start).Seconds(), attrs)
			}
			span := trace.SpanFromContext(ctx)
			span.SetAttributes(attribute.String("dlock.outcome", outcome))
			if l != nil && err == nil && call.Method != "Unlock" {
				span.SetAttributes(attribute.Int64("dlock.lease.token", int64(l.Token())))
			}
			if err != nil && outcome != "not_obtained" {
				span.RecordError(err)
				span.SetStatus(codes.Error, outcome)
			}
			span.End()
		},
		LeaseEnded: func(e dlock.LeaseEnd) {
			end := "unlocked"
			if e.Err != nil {
				end = dlock.Outcome(e.Err) // lost, expired, closed
			}
			held.Record(context.Background(), e.Held.Seconds(), metric.WithAttributes(attribute.String("dlock.lease.end", end)))
		},
		Renewed: func(r dlock.Renewal) {
			latency, err := r.Latency, r.Err
			outcome := dlock.Outcome(err) // ok, lost (refused), not_replicated, unavailable, error
			renewals.Add(context.Background(), 1, metric.WithAttributes(attribute.String("dlock.outcome", outcome)))
			if err == nil {
				renewDur.Record(context.Background(), latency.Seconds())
			}
		},
	}, nil
}

// waits reports whether call is one that waits for its lock (a TryLock or an Unlock does not).
func waits(call dlock.Call) bool {
	return call.Method == "Lock" || call.Method == "RLock" || call.Method == "Acquire"
}
