package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Seed 000: 8 tickets, 10 buyers. Each buyer reads the stock, spends a moment issuing the
// ticket, then writes the stock back: without a lock every buyer reads 8 and all 10 "succeed".
const (
	ticketStock = 8
	ticketIssue = 50 * time.Millisecond
)

var ticketScenario = &scenario{
	name:    "tickets",
	title:   fmt.Sprintf("Ticket sale (seed 000): %d tickets, 10 buyers in 5 processes, %v to issue a ticket", ticketStock, ticketIssue),
	procs:   5,
	perProc: 2,
	columns: []string{"sold", "refused", "tickets left"},
	setup: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys) error {
		return rdb.Set(ctx, k.key("stock"), ticketStock, 0).Err()
	},
	act: func(ctx context.Context, w *worker, buyer int) error {
		return w.locked(ctx, "tickets", func() error {
			stock, err := w.rdb.Get(ctx, w.keys.key("stock")).Int()
			if err != nil {
				return err
			}
			if stock < 1 {
				return w.rdb.RPush(ctx, w.keys.key("refused"), buyer).Err()
			}
			time.Sleep(ticketIssue) // issuing the ticket: the window in which others read a stale stock
			if err := w.rdb.Set(ctx, w.keys.key("stock"), stock-1, 0).Err(); err != nil {
				return err
			}
			return w.rdb.RPush(ctx, w.keys.key("sold"), buyer).Err()
		})
	},
	outcome: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys, _ time.Duration) (outcome, error) {
		sold, err := rdb.LLen(ctx, k.key("sold")).Result()
		if err != nil {
			return outcome{}, err
		}
		refused := rdb.LLen(ctx, k.key("refused")).Val()
		left, _ := rdb.Get(ctx, k.key("stock")).Int()
		o := outcome{cells: []string{strconv.FormatInt(sold, 10), strconv.FormatInt(refused, 10), strconv.Itoa(left)}}
		switch {
		case sold == ticketStock && refused == 10-ticketStock && left == 0:
			o.exact, o.text = true, fmt.Sprintf("exact: %d sold, %d refused", sold, refused)
		case sold > ticketStock:
			o.text = fmt.Sprintf("OVERSOLD: %d sold, only %d existed", sold, ticketStock)
		default:
			o.text = fmt.Sprintf("WRONG: stock says %d left after %d sales", left, sold)
		}
		return o, nil
	},
}
