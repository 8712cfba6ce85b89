package dlockotel_test

import (
	"context"
	"fmt"
	"os"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// New makes the Observer that reports through OpenTelemetry: a span per lock call, a child of
// the caller's span. Here the spans go to the SDK's in-memory recorder; a program passes
// nothing and uses its global providers, or WithTracerProvider and WithMeterProvider.
func ExampleNew() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL")) // in a real program: the client it already has
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	spans := tracetest.NewSpanRecorder()
	o, err := dlockotel.New(dlockotel.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))))
	if err != nil {
		panic(err)
	}
	c := dlock.New(rdb, dlock.WithObserver(o))
	defer c.Close(ctx)

	l, _ := c.Mutex("example:otel").Lock(ctx)
	_, _ = c.Mutex("example:otel", dlock.WithoutCohort()).TryLock(ctx) // another owner
	_ = l.Unlock(ctx)
	for _, s := range spans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "dlock.outcome" {
				fmt.Println(s.Name(), a.Value.AsString(), s.Status().Code)
			}
		}
	}
	// Output:
	// dlock.Lock ok Unset
	// dlock.TryLock not_obtained Unset
	// dlock.Unlock ok Unset
}

// WithTracerProvider and WithMeterProvider choose the providers; without them New uses
// OpenTelemetry's global ones (otel.SetTracerProvider, otel.SetMeterProvider).
func ExampleOption() {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	o, err := dlockotel.New(dlockotel.WithTracerProvider(tp))
	fmt.Println(err == nil, o.CallStart != nil, o.CallDone != nil)
	// Output:
	// true true true
}
