package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Seed 002: one side adds 1 and the other subtracts 1, 10,000 times each, on a shared counter
// read and written back: with a lock the result is 0 every time.
const counterOps = 10000

var counterScenario = &scenario{
	name:    "counter",
	title:   fmt.Sprintf("Shared counter (seed 002): +1 and -1, %d times each, from 2 processes × 4 goroutines", counterOps),
	procs:   2,
	perProc: 4,
	columns: []string{"+1 ops", "-1 ops", "counter"},
	setup: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys) error {
		return rdb.Set(ctx, k.key("counter"), 0, 0).Err()
	},
	act: func(ctx context.Context, w *worker, actor int) error {
		delta := 1 // process 0 adds, process 1 subtracts
		if actor >= 4 {
			delta = -1
		}
		for i := 0; i < counterOps/4; i++ {
			err := w.locked(ctx, "counter", func() error {
				v, err := w.rdb.Get(ctx, w.keys.key("counter")).Int()
				if err != nil {
					return err
				}
				return w.rdb.Set(ctx, w.keys.key("counter"), v+delta, 0).Err()
			})
			if err != nil {
				return err
			}
		}
		return nil
	},
	outcome: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys, _ time.Duration) (outcome, error) {
		v, err := rdb.Get(ctx, k.key("counter")).Int()
		if err != nil {
			return outcome{}, err
		}
		o := outcome{cells: []string{strconv.Itoa(counterOps), strconv.Itoa(counterOps), strconv.Itoa(v)}}
		if v == 0 {
			o.exact, o.text = true, "exact: 0"
		} else {
			o.text = fmt.Sprintf("WRONG: %+d, updates lost", v)
		}
		return o, nil
	},
}
