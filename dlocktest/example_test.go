package dlocktest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock"
)

// guard is what the code under test needs from a lock: take it or say why not, and a way to
// let it go. Depending on this rather than on *dlock.Mutex lets a unit test fake the lock
// without Redis; a *dlock.Lease cannot be faked (its behaviour lives in Redis), so the test of
// the real lock uses dlocktest.
type guard func(ctx context.Context) (release func(), err error)

// mutexGuard is the production guard: a dlock Mutex.
func mutexGuard(m *dlock.Mutex) guard {
	return func(ctx context.Context) (func(), error) {
		l, err := m.TryLock(ctx)
		if err != nil {
			return nil, err
		}
		return func() { _ = l.Unlock(context.WithoutCancel(ctx)) }, nil
	}
}

// runReport is the code under test: it makes a report unless another process is at it.
func runReport(ctx context.Context, g guard) (string, error) {
	release, err := g(ctx)
	if errors.Is(err, dlock.ErrNotObtained) {
		return "skipped: another process is making it", nil
	}
	if err != nil {
		return "", err
	}
	defer release()
	return "made", nil
}

// A unit test fakes the guard: here, a lock another process holds.
func Example_fakeForUnitTests() {
	busy := func(context.Context) (func(), error) { return nil, dlock.ErrNotObtained }
	free := func(context.Context) (func(), error) { return func() {}, nil }
	got, _ := runReport(context.Background(), busy)
	fmt.Println(got)
	got, _ = runReport(context.Background(), free)
	fmt.Println(got)
	// In production: runReport(ctx, mutexGuard(c.Mutex("report:daily"))).
	// Output:
	// skipped: another process is making it
	// made
}
