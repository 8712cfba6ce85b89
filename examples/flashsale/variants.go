package main

// The locks compared. Each is a Guard; the handler (service.go) is otherwise the same.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/bsm/redislock"
	"github.com/dlock-go/dlock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Variants lists the selectable guards in report order.
var Variants = []string{"none", "dlock", "dlock-unfenced", "redsync", "redislock", "pgforupdate"}

// lockTTL is the lease of the Redis locks that take one (redsync, redislock): far longer than
// an order takes, so no lock expires under a normal run.
const lockTTL = 10 * time.Second

// A Guard serialises one user's check-then-order.
type Guard interface {
	// Lock waits until user's lock is held or ctx ends. It returns the context the protected
	// work runs under, the lock's fencing token (0 when the lock has none) and the release.
	Lock(ctx context.Context, user int64) (work context.Context, token int64, unlock func(), err error)
	// InTx runs first in the order's transaction (pgforupdate locks there).
	InTx(ctx context.Context, tx pgx.Tx, user int64) error
	// Close frees what the guard holds.
	Close()
}

// NewGuard returns the guard called name, using rdb for the Redis locks.
func NewGuard(name string, rdb *redis.Client) (Guard, error) {
	switch name {
	case "none":
		return noLock{}, nil
	case "dlock":
		return dlockGuard{dlock.New(rdb), true}, nil // one Client per process, as in production
	case "dlock-unfenced":
		// The order written without its token, as the peers' are: the lock's own cost,
		// apart from the fence's extra PostgreSQL write.
		return dlockGuard{dlock.New(rdb), false}, nil
	case "redsync":
		// Best settings for a lock that is held a few ms and waited for by a handful of
		// clicks: retry every 2ms instead of the default 50-250ms, and keep trying until ctx
		// ends rather than giving up after 32 tries. One pool: no quorum to wait for.
		rs := redsync.New(rsgoredis.NewPool(rdb))
		return redsyncGuard{rs, []redsync.Option{redsync.WithExpiry(lockTTL),
			redsync.WithRetryDelay(2 * time.Millisecond), redsync.WithTries(1 << 20)}}, nil
	case "redislock":
		return redislockGuard{redislock.New(rdb)}, nil
	case "pgforupdate":
		return pgForUpdate{}, nil
	}
	return nil, fmt.Errorf("unknown variant %q (want one of %v)", name, Variants)
}

// lockName is the per-user lock, shared by the Redis variants.
func lockName(user int64) string { return "order:" + strconv.FormatInt(user, 10) }

// releaseCtx bounds a release, which runs after the request's context may have ended.
func releaseCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

// noLock is no lock at all: the race the others must prevent.
type noLock struct{}

func (noLock) Lock(ctx context.Context, _ int64) (context.Context, int64, func(), error) {
	return ctx, 0, func() {}, nil
}
func (noLock) InTx(context.Context, pgx.Tx, int64) error { return nil }
func (noLock) Close()                                    {}

// dlockGuard is a dlock Mutex per user. The work runs under the lease's context, so a lost
// lease cancels the transaction, and the order is fenced with the lease's token.
type dlockGuard struct {
	c      *dlock.Client
	fenced bool
}

func (g dlockGuard) Lock(ctx context.Context, user int64) (context.Context, int64, func(), error) {
	l, err := g.c.Mutex(lockName(user)).Lock(ctx)
	if err != nil {
		return nil, 0, nil, err
	}
	unlock := func() {
		ctx, cancel := releaseCtx()
		defer cancel()
		_ = l.Unlock(ctx)
	}
	if !g.fenced {
		return l.Context(), 0, unlock, nil
	}
	return l.Context(), int64(l.Token()), unlock, nil // tokens are µs-scale: they fit an int64
}
func (dlockGuard) InTx(context.Context, pgx.Tx, int64) error { return nil }
func (g dlockGuard) Close() {
	ctx, cancel := releaseCtx()
	defer cancel()
	_ = g.c.Close(ctx)
}

// redsyncGuard is a redsync Mutex per user. redsync has no fencing token: its orders are
// written unfenced.
type redsyncGuard struct {
	rs   *redsync.Redsync
	opts []redsync.Option
}

func (g redsyncGuard) Lock(ctx context.Context, user int64) (context.Context, int64, func(), error) {
	m := g.rs.NewMutex(lockName(user), g.opts...)
	if err := m.LockContext(ctx); err != nil {
		return nil, 0, nil, err
	}
	unlock := func() {
		ctx, cancel := releaseCtx()
		defer cancel()
		_, _ = m.UnlockContext(ctx)
	}
	return ctx, 0, unlock, nil
}
func (redsyncGuard) InTx(context.Context, pgx.Tx, int64) error { return nil }
func (redsyncGuard) Close()                                    {}

// redislockGuard is a bsm/redislock lock per user, retried every 2ms until ctx ends (Obtain
// alone tries once). redislock has no fencing token either.
type redislockGuard struct{ c *redislock.Client }

func (g redislockGuard) Lock(ctx context.Context, user int64) (context.Context, int64, func(), error) {
	l, err := g.c.Obtain(ctx, lockName(user), lockTTL,
		&redislock.Options{RetryStrategy: redislock.LinearBackoff(2 * time.Millisecond)})
	if err != nil {
		return nil, 0, nil, err
	}
	unlock := func() {
		ctx, cancel := releaseCtx()
		defer cancel()
		_ = l.Release(ctx)
	}
	return ctx, 0, unlock, nil
}
func (redislockGuard) InTx(context.Context, pgx.Tx, int64) error { return nil }
func (redislockGuard) Close()                                    {}

// pgForUpdate takes no Redis lock: the order's own transaction locks the user's users row
// (creating it first), so the lock and the orders live and die in one database transaction
// and need no fencing token. Stock is still the Redis counter.
type pgForUpdate struct{}

func (pgForUpdate) Lock(ctx context.Context, _ int64) (context.Context, int64, func(), error) {
	return ctx, 0, func() {}, nil
}

func (pgForUpdate) InTx(ctx context.Context, tx pgx.Tx, user int64) error {
	if _, err := tx.Exec(ctx, "INSERT INTO flashsale.users (user_id) VALUES ($1) ON CONFLICT DO NOTHING", user); err != nil {
		return err
	}
	var id int64
	err := tx.QueryRow(ctx, "SELECT user_id FROM flashsale.users WHERE user_id = $1 FOR UPDATE", user).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		err = fmt.Errorf("users row %d vanished", user)
	}
	return err
}
func (pgForUpdate) Close() {}
