package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// Seed family (RCountDownLatch): a flash sale opens only once 4 warehouse loaders, each in its
// own process, have loaded their stock. Without a latch the shop opens at once and takes
// orders against warehouses still empty; with a Latch of 4 it waits for the last CountDown.
const (
	saleWarehouses = 4
	saleOrders     = 20
)

var saleScenario = &scenario{
	name:    "sale",
	title:   fmt.Sprintf("Sale opening (count-down latch): %d warehouse loaders in their own processes, the shop takes %d orders once all are loaded", saleWarehouses, saleOrders),
	procs:   saleWarehouses + 1,
	perProc: 1,
	columns: []string{"orders", "orders before stock"},
	runs:    []string{noLock, runLatch},
	setup: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys) error {
		dl := dlock.New(rdb)
		defer dl.Close(ctx)
		_, err := dl.Latch(k.key("sale-open")).TrySetCount(ctx, saleWarehouses)
		return err
	},
	act: func(ctx context.Context, w *worker, actor int) error {
		latch := w.dl.Latch(w.keys.key("sale-open"))
		if actor > 0 { // a loader
			time.Sleep(time.Duration(20+rand.IntN(80)) * time.Millisecond) // loading its stock
			if err := w.rdb.Set(ctx, w.keys.key("loaded:"+strconv.Itoa(actor)), 1, 0).Err(); err != nil {
				return err
			}
			if w.run == runLatch {
				return latch.CountDown(ctx)
			}
			return nil
		}
		if w.run == runLatch {
			if err := latch.Wait(ctx); err != nil {
				return err
			}
		}
		for i := 0; i < saleOrders; i++ {
			loaded := 0
			for wh := 1; wh <= saleWarehouses; wh++ {
				n, err := w.rdb.Exists(ctx, w.keys.key("loaded:"+strconv.Itoa(wh))).Result()
				if err != nil {
					return err
				}
				loaded += int(n)
			}
			if loaded < saleWarehouses {
				if err := w.rdb.Incr(ctx, w.keys.key("early")).Err(); err != nil {
					return err
				}
			}
			if err := w.rdb.Incr(ctx, w.keys.key("orders")).Err(); err != nil {
				return err
			}
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	},
	outcome: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys, _ time.Duration) (outcome, error) {
		orders, _ := rdb.Get(ctx, k.key("orders")).Int()
		early, _ := rdb.Get(ctx, k.key("early")).Int()
		o := outcome{cells: []string{strconv.Itoa(orders), strconv.Itoa(early)}}
		if early == 0 {
			o.exact, o.text = true, "exact: no order before every warehouse was loaded"
		} else {
			o.text = fmt.Sprintf("WRONG: %d orders taken against unloaded stock", early)
		}
		return o, nil
	},
}
