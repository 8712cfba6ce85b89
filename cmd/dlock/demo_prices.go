package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Seed family (RReadWriteLock): a price table of pricesItems entries is reloaded, entry by
// entry, by one writer while 31 readers in 4 processes serve from it. Without a lock readers
// see half-written tables; a Mutex makes every read wait for every other; an RWMutex lets the
// readers share the table and stops them only while the writer reloads it.
const (
	pricesItems   = 20
	pricesReloads = 8
	pricesReads   = 25
	pricesServe   = time.Millisecond // a reader's work on the table it read
)

var pricesScenario = &scenario{
	name:    "prices",
	title:   fmt.Sprintf("Price table (read-write lock): 1 writer reloads %d prices %d times while 31 readers in 4 processes read %d times each", pricesItems, pricesReloads, pricesReads),
	procs:   4,
	perProc: 8,
	columns: []string{"reads", "torn reads", "reads/s"},
	runs:    []string{noLock, runMutex, runRWMutex},
	setup: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys) error {
		vals := make([]any, 0, 2*pricesItems)
		for i := 0; i < pricesItems; i++ {
			vals = append(vals, strconv.Itoa(i), 0)
		}
		return rdb.HSet(ctx, k.key("prices"), vals...).Err()
	},
	act: func(ctx context.Context, w *worker, actor int) error {
		table := w.keys.key("prices")
		if actor == 0 {
			for v := 1; v <= pricesReloads; v++ {
				err := w.write(ctx, "prices", func() error {
					for i := 0; i < pricesItems; i++ { // a reload, entry by entry
						if err := w.rdb.HSet(ctx, table, strconv.Itoa(i), v).Err(); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					return err
				}
				time.Sleep(10 * time.Millisecond) // until the next reload
			}
			return nil
		}
		for r := 0; r < pricesReads; r++ {
			err := w.read(ctx, "prices", func() error {
				vals, err := w.rdb.HGetAll(ctx, table).Result()
				if err != nil {
					return err
				}
				first := vals["0"]
				for _, v := range vals {
					if v != first {
						return w.rdb.Incr(ctx, w.keys.key("torn")).Err() // a half-reloaded table
					}
				}
				time.Sleep(pricesServe)
				return nil
			})
			if err != nil {
				return err
			}
			if err := w.rdb.Incr(ctx, w.keys.key("reads")).Err(); err != nil {
				return err
			}
		}
		return nil
	},
	outcome: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys, took time.Duration) (outcome, error) {
		reads, _ := rdb.Get(ctx, k.key("reads")).Int()
		torn, _ := rdb.Get(ctx, k.key("torn")).Int()
		rate := float64(reads) / took.Seconds()
		o := outcome{cells: []string{strconv.Itoa(reads), strconv.Itoa(torn), fmt.Sprintf("%.0f", rate)}}
		if torn == 0 {
			o.exact, o.text = true, fmt.Sprintf("exact: no torn read (%v)", took.Round(time.Millisecond))
		} else {
			o.text = fmt.Sprintf("WRONG: %d reads saw a half-reloaded table", torn)
		}
		return o, nil
	},
}
