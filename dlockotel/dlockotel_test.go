package dlockotel

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestMain(m *testing.M) {
	// Examples connect through REDIS_URL, as a program would; point it at the shared server.
	os.Exit(redistest.Main(m, func(s *redistest.Server) { os.Setenv("REDIS_URL", s.URL()) }))
}

// Spans and metrics of a Lock, a TryLock refused by another owner and an Unlock, through the
// SDK's in-memory span recorder and a manual metric reader: each call is a span, a child of
// the caller's span, with the lock's name, kind, outcome and the lease's token; a refused
// TryLock is not an error; the calls and the lease's end are counted.
func TestSpansAndMetrics(t *testing.T) {
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	o, err := New(WithTracerProvider(tp), WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(redistest.Client(t), dlock.WithObserver(o))
	defer c.Close(ctx)
	name := redistest.Name(t)

	ctx, parent := tp.Tracer("test").Start(ctx, "handler")
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex(name, dlock.WithoutCohort()).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	parent.End()

	ended := spans.Ended()
	if len(ended) != 4 {
		t.Fatalf("%d spans ended, want 4 (Lock, TryLock, Unlock, handler)", len(ended))
	}
	for i, want := range []struct {
		name, outcome string
		token         bool
	}{{"dlock.Lock", "ok", true}, {"dlock.TryLock", "not_obtained", false}, {"dlock.Unlock", "ok", false}} {
		s := ended[i]
		attrs := attribute.NewSet(s.Attributes()...)
		got, _ := attrs.Value("dlock.outcome")
		lockName, _ := attrs.Value("dlock.lock.name")
		kind, _ := attrs.Value("dlock.lock.kind")
		token, hasToken := attrs.Value("dlock.lease.token")
		switch {
		case s.Name() != want.name:
			t.Errorf("span %d: %s, want %s", i, s.Name(), want.name)
		case s.Parent().SpanID() != parent.SpanContext().SpanID():
			t.Errorf("%s: not a child of the caller's span", s.Name())
		case got.AsString() != want.outcome || lockName.AsString() != name || kind.AsString() != "mutex":
			t.Errorf("%s: attributes %v", s.Name(), s.Attributes())
		case hasToken != want.token || (want.token && uint64(token.AsInt64()) != l.Token()):
			t.Errorf("%s: token %v (%v), want the lease's %d", s.Name(), token.AsInt64(), hasToken, l.Token())
		case s.Status().Code == codes.Error:
			t.Errorf("%s: status Error (%s)", s.Name(), s.Status().Description)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					method, _ := p.Attributes.Value("dlock.method")
					outcome, _ := p.Attributes.Value("dlock.outcome")
					counts[m.Name+" "+method.AsString()+" "+outcome.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					end, _ := p.Attributes.Value("dlock.lease.end")
					counts[m.Name+" "+end.AsString()] += int64(p.Count)
				}
			}
		}
	}
	for k, want := range map[string]int64{
		"dlock.calls Lock ok":              1,
		"dlock.calls TryLock not_obtained": 1,
		"dlock.calls Unlock ok":            1,
		"dlock.lease.held unlocked":        1,
	} {
		if counts[k] != want {
			t.Errorf("%s: %d, want %d (all: %v)", k, counts[k], want, counts)
		}
	}
}

// A call that fails for another reason than the lock being taken is an error span.
func TestFailedCallIsAnErrorSpan(t *testing.T) {
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	o, err := New(WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(redistest.Client(t), dlock.WithObserver(o))
	_ = c.Close(ctx)
	if _, err := c.Mutex(redistest.Name(t)).TryLock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryLock after Close: %v", err)
	}
	ended := spans.Ended()
	if len(ended) != 1 || ended[0].Status().Code != codes.Error || len(ended[0].Events()) == 0 {
		t.Fatalf("spans %v: want one with status Error and the error recorded", ended)
	}
}

// dlock.lock.waiting counts the lock calls waiting now: 1 while a Lock waits for a held lock,
// 0 once it returned.
func TestWaitingCountsLockCallsInProgress(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	o, err := New(WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Client(t)
	holder := dlock.New(rdb, dlock.WithoutCohort())
	defer holder.Close(ctx)
	c := dlock.New(rdb, dlock.WithObserver(o))
	defer c.Close(ctx)
	name := redistest.Name(t)
	waiting := func() (int64, bool) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "dlock.lock.waiting" {
					for _, p := range d.DataPoints {
						if kind, _ := p.Attributes.Value("dlock.lock.kind"); kind.AsString() == "mutex" {
							return p.Value, true
						}
					}
				}
			}
		}
		return 0, false
	}
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
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n, ok := waiting(); ok && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dlock.lock.waiting never reached 1 while a Lock waited")
		}
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n, ok := waiting(); !ok || n != 0 {
		t.Fatalf("dlock.lock.waiting %d (reported: %v) after the Lock returned, want 0", n, ok)
	}
}
