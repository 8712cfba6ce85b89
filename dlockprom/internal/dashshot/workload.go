package main

// The workload: what two instances of a small service do with their locks, sized so every
// panel of the dashboard has something to show within a minute.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockprom"
	"github.com/dlock-go/dlock/internal/redisserver"
)

// Names of the locks. The job locks are contended; the report lock is held for seconds at a
// time (so the watchdog renews it) and is the one an operator breaks.
var jobLocks = []string{"job:orders", "job:billing", "job:emails"}

const reportLock = "report:nightly"

// workloadSummary is runWorkload in a line, for the picture.
const workloadSummary = "Workload: 2 clients, 8 workers on 3 job locks (held 2-20ms, 4x longer mid-run), " +
	"a TryLock every 50ms, a report job holding a lock 4s at a time, force-released 3 times"

// stats counts what the workload did, for the log.
type stats struct {
	locks, tryOK, tryConflicts, lost, errs atomic.Int64
}

func (s *stats) String() string {
	return fmt.Sprintf("%d Locks, %d TryLocks obtained and %d refused, %d leases lost to a forced release, %d unexpected errors",
		s.locks.Load(), s.tryOK.Load(), s.tryConflicts.Load(), s.lost.Load(), s.errs.Load())
}

// runWorkload runs for dur (or until ctx ends) on two Clients, standing for two instances of
// a service, both observed by m:
//   - 8 workers, started one after another over the first quarter (so the call rate ramps
//     up), Lock one of 3 job locks, hold it 2-20ms, Unlock, pause 0-30ms. Between 40% and
//     60% of the run they hold 4 times longer, a slow patch (a slow database, say) that waits
//     and held times should show.
//   - a poller TryLocks a random job lock every 50ms, as a handler answering "busy" would;
//     it is refused while a worker holds that lock.
//   - a report job holds its lock 4s at a time, so the watchdog renews it (TTL 1s).
//   - an operator force-releases the report lock at 25%, 50% and 75% of the run: each time
//     the report job's lease is lost.
func runWorkload(ctx context.Context, srv *redisserver.Server, m *dlockprom.Metrics, dur time.Duration) *stats {
	st := &stats{}
	start := time.Now()
	stopAt := start.Add(dur)
	running := func() bool { return ctx.Err() == nil && time.Now().Before(stopAt) }
	at := func(frac float64) time.Time { return start.Add(time.Duration(frac * float64(dur))) }
	slow := func() bool { t := time.Now(); return t.After(at(0.4)) && t.Before(at(0.6)) }
	fail := func(what string, err error) {
		if ctx.Err() == nil {
			st.errs.Add(1)
			log.Printf("%s: %v", what, err)
		}
	}

	var clients []*dlock.Client
	for range 2 {
		rdb := srv.Client()
		defer rdb.Close()
		c := dlock.New(rdb, dlock.WithObserver(m.Observer()), dlock.WithTTL(time.Second))
		defer c.Close(context.Background())
		clients = append(clients, c)
	}
	a, b := clients[0], clients[1]

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			sleepUntil(ctx, at(0.25*float64(i)/8))
			c, name := clients[i%2], jobLocks[i%len(jobLocks)]
			for running() {
				l, err := c.Mutex(name).Lock(ctx)
				if err != nil {
					fail("Lock "+name, err)
					continue
				}
				st.locks.Add(1)
				hold := time.Duration(2+rand.IntN(19)) * time.Millisecond
				if slow() {
					hold *= 4
				}
				time.Sleep(hold)
				if err := l.Unlock(ctx); err != nil {
					fail("Unlock "+name, err)
				}
				time.Sleep(time.Duration(rand.IntN(31)) * time.Millisecond)
			}
		})
	}

	wg.Go(func() {
		for ; running(); time.Sleep(50 * time.Millisecond) {
			name := jobLocks[rand.IntN(len(jobLocks))]
			// WithoutCohort: a request of its own, not joining the queue of b's workers.
			l, err := b.Mutex(name, dlock.WithoutCohort()).TryLock(ctx)
			switch {
			case errors.Is(err, dlock.ErrNotObtained):
				st.tryConflicts.Add(1)
			case err != nil:
				fail("TryLock "+name, err)
			default:
				st.tryOK.Add(1)
				time.Sleep(3 * time.Millisecond)
				if err := l.Unlock(ctx); err != nil {
					fail("Unlock "+name, err)
				}
			}
		}
	})

	wg.Go(func() {
		for running() {
			l, err := a.Mutex(reportLock).Lock(ctx)
			if err != nil {
				fail("Lock "+reportLock, err)
				continue
			}
			select {
			case <-time.After(min(4*time.Second, time.Until(stopAt))):
			case <-l.Done(): // lost: a real job would stop its work here
				st.lost.Add(1)
			case <-ctx.Done():
			}
			// As a deferred Unlock would, also after a loss (Unlock then fails: not held).
			_ = l.Unlock(ctx)
			sleepUntil(ctx, time.Now().Add(time.Second))
		}
	})

	wg.Go(func() {
		for _, frac := range []float64{0.25, 0.5, 0.75} {
			sleepUntil(ctx, at(frac))
			// The report job pauses 1s between runs: retry until the release found it held.
			for running() {
				held, err := b.ForceRelease(ctx, reportLock)
				if err != nil {
					fail("ForceRelease", err)
				}
				if held {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	})

	wg.Wait()
	return st
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-time.After(time.Until(t)):
	case <-ctx.Done():
	}
}
