package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Seed family (RedissonMultiLock): 16 tellers in 4 processes move money between 6 accounts,
// each transfer taking the two account locks in its own order (from, then to). Without locks
// money appears and vanishes; nested Mutexes deadlock when two transfers go opposite ways and
// need a timeout to break it; a MultiLock takes both at once and never deadlocks.
const (
	transferAccounts = 6
	transferBalance  = 1000
	transferEach     = 10
)

var transferScenario = &scenario{
	name:    "transfer",
	title:   fmt.Sprintf("Transfers (multi-lock): 16 tellers in 4 processes, %d transfers each between %d accounts, locks taken in opposite orders", transferEach, transferAccounts),
	procs:   4,
	perProc: 4,
	columns: []string{"transfers", "deadlocks broken by timeout", "total money"},
	runs:    []string{noLock, runNested, runMulti},
	setup: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys) error {
		for a := 0; a < transferAccounts; a++ {
			if err := rdb.Set(ctx, k.key("account:"+strconv.Itoa(a)), transferBalance, 0).Err(); err != nil {
				return err
			}
		}
		return nil
	},
	act: func(ctx context.Context, w *worker, teller int) error {
		rng := rand.New(rand.NewPCG(uint64(teller), uint64(time.Now().UnixNano())))
		for done := 0; done < transferEach; {
			from, to := rng.IntN(transferAccounts), rng.IntN(transferAccounts-1)
			if to >= from {
				to++
			}
			fk, tk := "account:"+strconv.Itoa(from), "account:"+strconv.Itoa(to)
			amount := 1 + rng.IntN(10)
			ran, err := w.all(ctx, []string{fk, tk}, func() error {
				a, err := w.rdb.Get(ctx, w.keys.key(fk)).Int()
				if err != nil {
					return err
				}
				b, err := w.rdb.Get(ctx, w.keys.key(tk)).Int()
				if err != nil {
					return err
				}
				time.Sleep(time.Millisecond) // checks before the money moves
				if err := w.rdb.Set(ctx, w.keys.key(fk), a-amount, 0).Err(); err != nil {
					return err
				}
				return w.rdb.Set(ctx, w.keys.key(tk), b+amount, 0).Err()
			})
			if err != nil {
				return err
			}
			if !ran {
				if err := w.rdb.Incr(ctx, w.keys.key("deadlocks")).Err(); err != nil {
					return err
				}
				continue
			}
			done++
			if err := w.rdb.Incr(ctx, w.keys.key("transfers")).Err(); err != nil {
				return err
			}
		}
		return nil
	},
	outcome: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys, took time.Duration) (outcome, error) {
		total := 0
		for a := 0; a < transferAccounts; a++ {
			v, err := rdb.Get(ctx, k.key("account:"+strconv.Itoa(a))).Int()
			if err != nil {
				return outcome{}, err
			}
			total += v
		}
		transfers, _ := rdb.Get(ctx, k.key("transfers")).Int()
		deadlocks, _ := rdb.Get(ctx, k.key("deadlocks")).Int()
		o := outcome{cells: []string{strconv.Itoa(transfers), strconv.Itoa(deadlocks), strconv.Itoa(total)}}
		want := transferAccounts * transferBalance
		switch {
		case total != want:
			o.text = fmt.Sprintf("WRONG: %+d money created or lost", total-want)
		case deadlocks > 0:
			o.exact, o.text = true, fmt.Sprintf("money conserved, after %d deadlocks broken by timeouts (%v)", deadlocks, took.Round(time.Millisecond))
		default:
			o.exact, o.text = true, fmt.Sprintf("exact: money conserved, no deadlock (%v)", took.Round(time.Millisecond))
		}
		return o, nil
	},
}
