package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// FencedSet writes value to the fenced resource at key, unless a write carrying a higher
// fencing token was already accepted there. It is how a resource kept in Redis refuses a
// holder whose lease ended without it noticing (a long GC pause, a partition): the newer
// holder's token is higher, so the stale write is rejected with ErrStaleToken. Equal tokens are
// accepted, so one holder may write many times.
//
// The resource is a hash {v: value, t: highest token}; read it with FencedGet. key may live
// on any Redis, including one separate from the locks'. One round trip, one Lua script.
func FencedSet(ctx context.Context, rdb redis.Scripter, key string, value any, token uint64) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty fenced resource key", ErrInvalid)
	case ctx == nil:
		return nilContext("fenced set", key)
	case isNilValue(rdb):
		return fmt.Errorf("%w: fenced set %q: nil Redis client", ErrInvalid, key)
	}
	ok, err := scripts.FencedSet.Run(ctx, rdb, []string{key}, value, strconv.FormatUint(token, 10)).Int()
	if err != nil {
		return redisErr("fenced set", key, err)
	}
	if ok == 0 {
		return fmt.Errorf("%w: %q refused token %d", ErrStaleToken, key, token)
	}
	return nil
}

// FencedGet reads a resource written by FencedSet: its value and the highest token accepted.
// A missing resource returns "", 0 and a nil error.
func FencedGet(ctx context.Context, rdb redis.Cmdable, key string) (value string, token uint64, err error) {
	switch {
	case ctx == nil:
		return "", 0, nilContext("fenced get", key)
	case isNilValue(rdb):
		return "", 0, fmt.Errorf("%w: fenced get %q: nil Redis client", ErrInvalid, key)
	}
	vals, err := rdb.HMGet(ctx, key, "v", "t").Result()
	if err != nil {
		return "", 0, redisErr("fenced get", key, err)
	}
	if vals[1] == nil {
		return "", 0, nil
	}
	v, _ := vals[0].(string)
	t, err := strconv.ParseUint(fmt.Sprint(vals[1]), 10, 64)
	if err != nil {
		return "", 0, errors.Join(fmt.Errorf("dlock: fenced get %q: malformed token", key), err)
	}
	return v, t, nil
}
