package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// Seed family (RSemaphore, leased): 5 processes export reports, and the reporting database
// takes at most 2 exports at once. Without a limit all 5 run together; with a Semaphore of 2
// never more than 2, and the permit of an exporter killed with SIGKILL mid-export comes back
// within its lease TTL (Redisson's plain RSemaphore would lose it for good).
const (
	exportProcs   = 5
	exportPermits = 2
	exportEach    = 4
	exportTakes   = 100 * time.Millisecond
	exportTTL     = time.Second // the exporters' lease TTL: how long a killed one keeps its permit
)

var exportsScenario = &scenario{
	name:    "exports",
	title:   fmt.Sprintf("Report exports (semaphore): %d processes export %d reports each, at most %d at once; one exporter is SIGKILLed mid-export", exportProcs, exportEach, exportPermits),
	procs:   exportProcs,
	perProc: 1,
	columns: []string{"exports", "most at once", "killed's permit back"},
	runs:    []string{noLock, runSemaphore},
	dies:    func(run string, proc int) bool { return run == runSemaphore && proc == 0 },
	setup:   func(context.Context, redis.UniversalClient, demoKeys) error { return nil },
	act: func(ctx context.Context, w *worker, actor int) error {
		sem := w.dl.Semaphore(w.keys.key("exports"), exportPermits, dlock.WithTTL(exportTTL))
		for i := 0; i < exportEach; i++ {
			var l *dlock.Lease
			if w.run == runSemaphore {
				var err error
				if l, err = sem.Acquire(ctx, 1); err != nil {
					return err
				}
				if actor == 0 {
					// Killed mid-export: no Unlock ever runs, its renewals stop.
					if err := w.rdb.Set(ctx, w.keys.key("killed-at"), time.Now().UnixMicro(), 0).Err(); err != nil {
						return err
					}
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {}
				}
			}
			// Count the exports running; the first time all permits are in use again after
			// the kill, the dead exporter's permit has come back: note how long that took.
			n, err := w.rdb.Eval(ctx, `local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
local at = redis.call('GET', KEYS[3])
if at and n >= tonumber(ARGV[2]) then redis.call('SET', KEYS[4], tonumber(ARGV[1]) - tonumber(at), 'NX') end
return n`, []string{w.keys.key("running"), w.keys.key("most"), w.keys.key("killed-at"), w.keys.key("back-after")},
				time.Now().UnixMicro(), exportPermits).Int()
			if err != nil || n < 1 {
				return fmt.Errorf("count exports: %v", err)
			}
			time.Sleep(exportTakes) // the export
			if err := w.rdb.Decr(ctx, w.keys.key("running")).Err(); err != nil {
				return err
			}
			if err := w.rdb.Incr(ctx, w.keys.key("exports")).Err(); err != nil {
				return err
			}
			if l != nil {
				if err := l.Unlock(ctx); err != nil {
					return err
				}
			}
		}
		return nil
	},
	outcome: func(ctx context.Context, rdb redis.UniversalClient, k demoKeys, took time.Duration) (outcome, error) {
		exports, _ := rdb.Get(ctx, k.key("exports")).Int()
		most, _ := rdb.Get(ctx, k.key("most")).Int()
		back := "-"
		backUs, err := rdb.Get(ctx, k.key("back-after")).Int64()
		if err == nil {
			back = (time.Duration(backUs) * time.Microsecond).Round(time.Millisecond).String()
		}
		o := outcome{cells: []string{strconv.Itoa(exports), strconv.Itoa(most), back}}
		switch {
		case most > exportPermits:
			o.text = fmt.Sprintf("OVERLOADED: %d exports at once, the limit is %d", most, exportPermits)
		case err != nil:
			o.text = "STUCK: the killed exporter's permit never came back"
		default:
			o.exact, o.text = true, fmt.Sprintf("exact: never more than %d at once; the killed exporter's permit came back when its lease ran out (within its %v TTL)", exportPermits, exportTTL)
		}
		return o, nil
	},
}
