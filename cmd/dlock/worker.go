package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// workerCommand is the hidden subcommand the demo runs in each worker process.
const workerCommand = "__demo-worker"

// worker is one demo process: a few actors sharing one dlock Client.
type worker struct {
	rdb    redis.UniversalClient
	dl     *dlock.Client
	keys   demoKeys
	useLck bool
}

// locked runs f under the lock named name when the run uses locks, else runs it bare.
func (w *worker) locked(ctx context.Context, name string, f func() error) error {
	if !w.useLck {
		return f()
	}
	l, err := w.dl.Mutex(w.keys.key(name)).Lock(ctx)
	if err != nil {
		return err
	}
	ferr := f()
	return errors.Join(ferr, l.Unlock(ctx))
}

func runWorker(args []string) error {
	fs := flag.NewFlagSet(workerCommand, flag.ContinueOnError)
	url := fs.String("redis", "", "")
	name := fs.String("scenario", "", "")
	keys := fs.String("keys", "", "")
	useLock := fs.Bool("locked", false, "")
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
	w := &worker{rdb: rdb, dl: dl, keys: demoKeys(*keys), useLck: *useLock}

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
