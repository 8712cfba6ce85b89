package dlockrueidis

import (
	"context"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

// The refusals of AUTH that a failed credentials refresh can drain a connection's calls with,
// as this Redis words them (rueidis drops an error's "ERR " prefix), read as authentication
// failures; dlock's own script errors, which quote lock names, never do.
func TestAuthFailuresAsRedisWordsThem(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t) // its default user has no password
	for _, args := range [][]any{
		{"AUTH", "no-such-user", "pw"}, // WRONGPASS
		{"AUTH", "pw"},                 // a password for a default user without one
	} {
		err := rdb.Do(ctx, args...).Err()
		if err == nil {
			t.Fatalf("%v: no error", args)
		}
		msg := strings.TrimPrefix(err.Error(), "ERR ")
		if !isAuthFailure(msg) {
			t.Errorf("%v: %q not read as an authentication failure", args, msg)
		}
	}
	for _, msg := range []string{ // definite answers that quote names a user chooses
		"DLOCKKIND lock dlock:{password-reset} is a mutex, not a read-write lock",
		"NOPERM User password-svc has no permissions to run the 'evalsha' command",
		"ACL failure in script: User AUTHZ has no permissions to run the 'publish' command script: x",
		"unknown command 'evalsha', with args beginning with: 'f2bf' '5' 'dlock:{password-reset}' ",
		"MOVED 12 password-redis-0.svc:6379",
		"WRONGTYPE Operation against a key holding the wrong kind of value",
	} {
		if isAuthFailure(msg) {
			t.Errorf("%q read as an authentication failure", msg)
		}
	}
}
