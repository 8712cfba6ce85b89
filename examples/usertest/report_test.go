package usertest

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

func TestReportRunsOnceWhileAnotherProcessHoldsIt(t *testing.T) {
	ctx := context.Background()
	s := dlocktest.Start(t)
	mine := &Reports{Locks: dlock.New(s.Client(t))}
	defer mine.Locks.Close(ctx)
	other := dlock.New(s.Client(t)) // another process's Client on the same Redis
	defer other.Close(ctx)

	l, err := other.Mutex("report:daily").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := mine.Run(ctx, "daily"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Run while another process makes it: %v, want ErrNotObtained", err)
	}
	_ = l.Unlock(ctx)
	if err := mine.Run(ctx, "daily"); err != nil {
		t.Fatal(err)
	}
	if len(mine.Done) != 1 {
		t.Fatalf("reports made: %v", mine.Done)
	}
}
