package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Seed 003: a flash sale of vouchers. Each user double-clicks (two concurrent requests) and may
// buy one voucher: a lock per user id (lock:order:<userId>) keeps it to one order, a lock on
// the stock keeps the check-and-decrement exact.
const (
	seckillStock = 20
	seckillUsers = 30
)

var seckillScenario = &scenario{
	name:    "seckill",
	title:   fmt.Sprintf("Flash sale (seed 003): %d vouchers, %d users clicking twice, in 5 processes, one order per user", seckillStock, seckillUsers),
	procs:   5,
	perProc: 2 * seckillUsers / 5,
	columns: []string{"orders", "users with 2 orders", "vouchers left"},
	setup: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys) error {
		return rdb.Set(ctx, k.key("stock"), seckillStock, 0).Err()
	},
	act: func(ctx context.Context, w *worker, actor int) error {
		user := strconv.Itoa(actor / 2) // actors 2u and 2u+1 are user u's two clicks
		return w.locked(ctx, "order:"+user, func() error {
			if n, err := w.rdb.Exists(ctx, w.keys.key("order:"+user)).Result(); err != nil || n > 0 {
				return err // this user already ordered
			}
			return w.locked(ctx, "stock", func() error {
				stock, err := w.rdb.Get(ctx, w.keys.key("stock")).Int()
				if err != nil || stock < 1 {
					return err
				}
				time.Sleep(10 * time.Millisecond) // creating the order
				if err := w.rdb.Set(ctx, w.keys.key("stock"), stock-1, 0).Err(); err != nil {
					return err
				}
				if err := w.rdb.Incr(ctx, w.keys.key("order:"+user)).Err(); err != nil {
					return err
				}
				return w.rdb.Incr(ctx, w.keys.key("orders")).Err()
			})
		})
	},
	outcome: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys, _ time.Duration) (outcome, error) {
		orders, _ := rdb.Get(ctx, k.key("orders")).Int()
		left, _ := rdb.Get(ctx, k.key("stock")).Int()
		doubles := 0
		for u := 0; u < seckillUsers; u++ {
			if n, _ := rdb.Get(ctx, k.key("order:"+strconv.Itoa(u))).Int(); n > 1 {
				doubles++
			}
		}
		o := outcome{cells: []string{strconv.Itoa(orders), strconv.Itoa(doubles), strconv.Itoa(left)}}
		switch {
		case orders == seckillStock && doubles == 0 && left == 0:
			o.exact, o.text = true, fmt.Sprintf("exact: %d orders, one per user, none oversold", orders)
		case orders > seckillStock:
			o.text = fmt.Sprintf("OVERSOLD: %d orders for %d vouchers, %d users ordered twice", orders, seckillStock, doubles)
		default:
			o.text = fmt.Sprintf("WRONG: %d orders, %d users ordered twice, %d vouchers left", orders, doubles, left)
		}
		return o, nil
	},
}
