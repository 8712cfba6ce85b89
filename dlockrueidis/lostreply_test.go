package dlockrueidis_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// losing is a connection that, once armed, lets a command naming sha reach Redis and then
// drops the connection before its reply is read: the script ran, the caller never hears.
type losing struct {
	net.Conn
	f    *lossFault
	lose atomic.Bool // a matching command went out here: drop the connection at its reply
}

type lossFault struct {
	mu    sync.Mutex
	sha   string
	armed int // commands still to lose
}

func (c *losing) Write(b []byte) (int, error) {
	c.f.mu.Lock()
	if c.f.armed > 0 && strings.Contains(string(b), c.f.sha) {
		c.f.armed--
		c.lose.Store(true)
	}
	c.f.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *losing) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.lose.Swap(false) {
		_ = c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return n, err
}

// losingClient returns a dlock Client whose scripts run on rueidis over connections that lose
// the reply of the next n commands naming sha, and a plain go-redis client of the server.
func losingClient(t *testing.T, sha string, n int) (*dlock.Client, *redis.Client) {
	t.Helper()
	raw := redistest.Client(t)
	f := &lossFault{sha: sha, armed: n}
	o := redistest.Shared(t).Options()
	o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &losing{Conn: cn, f: f}, nil
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	rc, err := dlockrueidis.ClientFor(rdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	return newClient(t, dlockrueidis.New(rdb, rc, dlock.WithoutCohort())), raw
}

// TestLostUnlockReplyOnRueidis: a release whose reply rueidis never gets is an unknown outcome
// (ErrUnavailable), not an answer, and Unlock called again finds it done.
func TestLostUnlockReplyOnRueidis(t *testing.T) {
	ctx := context.Background()
	c, raw := losingClient(t, scripts.Release.Hash(), 1)
	scripts.Release.Load(ctx, raw)
	scripts.Acquire.Load(ctx, raw)
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Unlock with its reply lost = %v, want ErrUnavailable", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock again after the release ran = %v, want nil", err)
	}
	if n := raw.Exists(ctx, dlock.DefaultKeyPrefix+"{"+name+"}").Val(); n != 0 {
		t.Fatal("lock still held after the retried Unlock")
	}
}

// TestLostAcquireReplyOnRueidisIsUndone: an acquire that ran with its reply lost leaves no lock
// behind for its TTL: dlock gives it back in the background.
func TestLostAcquireReplyOnRueidisIsUndone(t *testing.T) {
	ctx := context.Background()
	c, raw := losingClient(t, scripts.Acquire.Hash(), 1)
	scripts.Acquire.Load(ctx, raw)
	name := redistest.Name(t)
	if _, err := c.Mutex(name).TryLock(ctx); err == nil || errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("TryLock with its reply lost = %v, want ErrUnavailable", err)
	}
	other := newClient(t, dlock.New(raw))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second) // the lost acquire's TTL is 30s
	defer cancel()
	l, err := other.Mutex(name).Lock(wctx)
	if err != nil {
		t.Fatalf("lock left held after an acquire whose reply was lost: %v", err)
	}
	_ = l.Unlock(ctx)
}
