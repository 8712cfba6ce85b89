package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Seed 001: the order clean-up job. Every node's scheduler wakes at each tick; exactly one
// node may restore the stock of unpaid orders per tick, the others skip.
const (
	cronNodes = 5
	cronTicks = 5
	cronEvery = 300 * time.Millisecond
)

var cronScenario = &scenario{
	name:    "cron",
	title:   fmt.Sprintf("Scheduled clean-up (seed 001): %d nodes wake every %v for %d ticks; one clean-up per tick", cronNodes, cronEvery, cronTicks),
	procs:   cronNodes,
	perProc: 1,
	columns: []string{"ticks", "clean-up runs", "skipped"},
	setup:   func(context.Context, redis.UniversalClient, demoKeys) error { return nil },
	act: func(ctx context.Context, w *worker, node int) error {
		start := time.Now()
		for tick := 0; tick < cronTicks; tick++ {
			time.Sleep(time.Until(start.Add(time.Duration(tick) * cronEvery)))
			t := strconv.Itoa(tick)
			err := w.locked(ctx, "cleanup", func() error {
				if n, err := w.rdb.Exists(ctx, w.keys.key("done:"+t)).Result(); err != nil || n > 0 {
					if err == nil {
						err = w.rdb.Incr(ctx, w.keys.key("skipped")).Err()
					}
					return err
				}
				time.Sleep(50 * time.Millisecond) // restoring stock for unpaid orders
				if err := w.rdb.Incr(ctx, w.keys.key("runs")).Err(); err != nil {
					return err
				}
				return w.rdb.Set(ctx, w.keys.key("done:"+t), node, 0).Err()
			})
			if err != nil {
				return err
			}
		}
		return nil
	},
	outcome: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys, _ time.Duration) (outcome, error) {
		runs, _ := rdb.Get(ctx, k.key("runs")).Int()
		skipped, _ := rdb.Get(ctx, k.key("skipped")).Int()
		o := outcome{cells: []string{strconv.Itoa(cronTicks), strconv.Itoa(runs), strconv.Itoa(skipped)}}
		if runs == cronTicks && skipped == cronTicks*(cronNodes-1) {
			o.exact, o.text = true, "exact: one clean-up per tick"
		} else {
			o.text = fmt.Sprintf("REPEATED: %d clean-ups for %d ticks", runs, cronTicks)
		}
		return o, nil
	},
}
