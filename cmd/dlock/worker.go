package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// workerCommand is the hidden subcommand the demo runs in each worker process.
const workerCommand = "__demo-worker"

// worker is one demo process: a few actors sharing one dlock Client.
type worker struct {
	rdb  redis.UniversalClient
	dl   *dlock.Client
	keys demoKeys
	run  string // the run's label (demo.go): which lock, if any, the helpers take
}

// locked runs f under the lock named name when the run uses locks, else runs it bare.
func (w *worker) locked(ctx context.Context, name string, f func() error) error {
	if w.run == noLock {
		return f()
	}
	return under(ctx, f)(w.dl.Mutex(w.keys.key(name)).Lock(ctx))
}

// under returns a function that runs f under the lease a lock call returned, then unlocks.
func under(ctx context.Context, f func() error) func(*dlock.Lease, error) error {
	return func(l *dlock.Lease, err error) error {
		if err != nil {
			return err
		}
		return errors.Join(f(), l.Unlock(ctx))
	}
}

// read runs f as a reader of name: under an RWMutex read lease, a Mutex, or bare, by run.
func (w *worker) read(ctx context.Context, name string, f func() error) error {
	if w.run == runRWMutex {
		return under(ctx, f)(w.dl.RWMutex(w.keys.key(name)).RLock(ctx))
	}
	return w.locked(ctx, name, f)
}

// write runs f as the writer of name: under an RWMutex write lease, a Mutex, or bare, by run.
func (w *worker) write(ctx context.Context, name string, f func() error) error {
	if w.run == runRWMutex {
		return under(ctx, f)(w.dl.RWMutex(w.keys.key(name)).Lock(ctx))
	}
	return w.locked(ctx, name, f)
}

// all runs f holding every lock of names: a MultiLock, or Mutexes taken one after the other in
// the given order (each wait bounded by nestedWait: two callers taking two locks in opposite
// orders would otherwise wait for each other forever), or bare, by run. It reports whether f
// ran; false means a nested wait timed out (a deadlock broken), and the caller retries.
func (w *worker) all(ctx context.Context, names []string, f func() error) (bool, error) {
	switch w.run {
	case noLock:
		return true, f()
	case runMulti:
		keys := make([]string, len(names))
		for i, n := range names {
			keys[i] = w.keys.key(n)
		}
		return true, under(ctx, f)(w.dl.MultiLock(keys).Lock(ctx))
	}
	var held []*dlock.Lease
	defer func() {
		for _, l := range held {
			_ = l.Unlock(ctx)
		}
	}()
	for _, n := range names {
		wctx, cancel := context.WithTimeout(ctx, nestedWait)
		l, err := w.dl.Mutex(w.keys.key(n), dlock.WithoutCohort()).Lock(wctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		held = append(held, l)
	}
	return true, f()
}

// nestedWait bounds each lock wait of the nested-Mutexes run.
const nestedWait = 50 * time.Millisecond

// workerRedisEnv is the variable that gives a demo worker its Redis URL: the environment of
// a process is readable by its user only, its argv by everyone.
const workerRedisEnv = "DLOCK_DEMO_WORKER_REDIS"

func runWorker(args []string) error {
	fs := flag.NewFlagSet(workerCommand, flag.ContinueOnError)
	url := fs.String("redis", os.Getenv(workerRedisEnv), "")
	name := fs.String("scenario", "", "")
	keys := fs.String("keys", "", "")
	run := fs.String("run", noLock, "")
	actors := fs.Int("actors", 1, "")
	proc := fs.Int("proc", 0, "")
	start := fs.Int64("start", 0, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s := scenarios[*name]
	if s == nil {
		return fmt.Errorf("unknown scenario %q", *name)
	}
	rdb, err := openURL(*url)
	if err != nil {
		return err
	}
	defer rdb.Close()
	dl := dlock.New(rdb)
	defer dl.Close(context.Background())
	w := &worker{rdb: rdb, dl: dl, keys: demoKeys(*keys), run: *run}

	time.Sleep(time.Until(time.Unix(0, *start))) // the shared start line across processes
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, *actors)
	for a := 0; a < *actors; a++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[a] = s.act(ctx, w, *proc*(*actors)+a)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
