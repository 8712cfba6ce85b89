// Package usertest is a user's code as it would test itself with dlocktest: a separate module
// that imports dlock and dlocktest like any other dependency (make test runs it).
package usertest

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock"
)

// Reports runs one report at a time across every process that shares the Redis.
type Reports struct {
	Locks *dlock.Client
	Done  []string
}

// Run makes the report called name under its lock, unless another process is making it.
func (r *Reports) Run(ctx context.Context, name string) error {
	l, err := r.Locks.Mutex("report:" + name).TryLock(ctx)
	if err != nil {
		return fmt.Errorf("report %s: %w", name, err)
	}
	defer l.Unlock(ctx)
	r.Done = append(r.Done, name)
	return nil
}
