package dlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Redis error replies that mean "not now, ask again (maybe elsewhere)": the server is not the
// lock's current master or cannot write yet. None of them is an answer about the lock.
var unavailablePrefixes = []string{
	"LOADING", "READONLY", "MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN",
	"NOREPLICAS", "BUSY", "NOTBUSY", "UNBLOCKED", "MISCONF",
}

// replyKind sorts an error from a Redis call.
type replyKind int

const (
	replyOther        replyKind = iota // an error Redis answered about the call (WRONGTYPE, NOPERM, ...)
	replyUnavailable                   // no definite answer: connection failure, timeout, failover reply
	replyClosed                        // the go-redis client was closed
	replyIncompatible                  // server too old, or a lock of another key layout
	replyMisuse                        // a lock taken as another kind, a read hold taken to write, a semaphore with another count
)

// classify sorts err. Transport failures are unavailable whether or not the command ran; the
// caller decides what an unknown outcome means for it.
func classify(err error) replyKind {
	if errors.Is(err, redis.ErrClosed) {
		return replyClosed
	}
	var rerr redis.Error
	if errors.As(err, &rerr) && !errors.Is(err, context.DeadlineExceeded) {
		msg := rerr.Error()
		for _, p := range unavailablePrefixes {
			if strings.HasPrefix(msg, p+" ") || msg == p {
				return replyUnavailable
			}
		}
		if strings.HasPrefix(msg, "DLOCKLAYOUT") || isOldServer(msg) {
			return replyIncompatible
		}
		if strings.HasPrefix(msg, "DLOCKKIND") || strings.HasPrefix(msg, "DLOCKUPGRADE") || strings.HasPrefix(msg, "DLOCKPERMITS") {
			return replyMisuse
		}
		return replyOther
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, redis.ErrPoolTimeout) {
		return replyUnavailable
	}
	return replyOther
}

// isOldServer recognises a pre-7.0 server refusing the "#!lua" line of dlock's scripts.
func isOldServer(msg string) bool {
	return strings.Contains(msg, "Error compiling script") && strings.Contains(msg, "'#'")
}

// isRedisReply tells an error Redis answered (the script did not change anything) from a
// transport failure or timeout, after which the script may or may not have run.
func isRedisReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, context.DeadlineExceeded)
}

// redisErr wraps an error from a Redis call in what it means for the caller: ErrUnavailable,
// ErrClosed, ErrIncompatible, or ErrInvalid for a lock used as another kind (each wrapping the
// cause), or the cause itself. op names the
// call ("lock", "unlock", ...).
func redisErr(op, name string, err error) error {
	switch classify(err) {
	case replyUnavailable:
		return fmt.Errorf("dlock: %s %q: %w: %w", op, name, ErrUnavailable, err)
	case replyClosed:
		return fmt.Errorf("dlock: %s %q: %w (the go-redis client): %w", op, name, ErrClosed, err)
	case replyIncompatible:
		if isOldServer(err.Error()) {
			return fmt.Errorf("dlock: %s %q: %w: dlock needs Redis 7.0 or later (an emulator such as miniredis cannot run its scripts; for tests, dlocktest starts a real redis-server): %w", op, name, ErrIncompatible, err)
		}
		return fmt.Errorf("dlock: %s %q: %w: %w", op, name, ErrIncompatible, err)
	case replyMisuse:
		return fmt.Errorf("dlock: %s %q: %w: %w", op, name, ErrInvalid, err)
	}
	return fmt.Errorf("dlock: %s %q: %w", op, name, err)
}

// nilContext is the error of a call given a nil context.Context, answered before anything is
// touched (a nil ctx would panic deep inside, possibly with a lease half-released).
func nilContext(op, name string) error {
	return fmt.Errorf("%w: %s %q: nil Context (use context.Background or context.TODO)", ErrInvalid, op, name)
}

// notObtained is the error of a caller that did not get the lock, joined with why (a ctx
// error, a cause).
func notObtained(name string, why ...error) error {
	return join(append([]error{fmt.Errorf("%w: %q", ErrNotObtained, name)}, why...)...)
}
