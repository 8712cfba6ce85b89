package dlockrueidis_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/rueidis"
)

// reauthGate is the connection side of TestFailedReAuthIsNoAnswer: on the connection that
// writes the refresh's AUTH, it holds the server's replies back until the script has gone out
// behind it, then lets through the AUTH's error line alone and nothing after it. So the script
// runs (a failed AUTH leaves the connection as it was) and rueidis, retiring the connection on
// the AUTH's error, fails the script's call with that error instead of its reply. Connections
// made afterwards pass everything.
type reauthGate struct {
	armed    atomic.Bool // the refresh is under way: the next AUTH written is its own
	sha      string
	authOut  chan struct{} // closed when the refresh's AUTH is written
	evalSent chan struct{} // closed when the script follows the AUTH out on that connection
}

type gatedConn struct {
	net.Conn
	g      *reauthGate
	closed chan struct{}
	once   sync.Once

	mu       sync.Mutex
	authSent bool // this connection wrote the refresh's AUTH
	evalSent bool
	passed   bool // the AUTH's error line went through: nothing more does
}

func (c *gatedConn) Write(b []byte) (int, error) {
	g := c.g
	c.mu.Lock()
	switch {
	case !c.authSent && bytes.Contains(b, []byte("AUTH")) && g.armed.CompareAndSwap(true, false):
		c.authSent = true
		defer close(g.authOut) // once it is written
	case c.authSent && !c.evalSent && bytes.Contains(b, []byte(g.sha)):
		c.evalSent = true
		defer close(g.evalSent)
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *gatedConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	passed := c.passed
	c.mu.Unlock()
	if passed {
		<-c.closed
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	gated := c.authSent // checked once the read returns: it may have begun before the AUTH
	c.mu.Unlock()
	if !gated || n == 0 {
		return n, err
	}
	select {
	case <-c.g.evalSent:
	case <-c.closed:
		return 0, net.ErrClosed
	}
	if i := bytes.Index(b[:n], []byte("-WRONGPASS")); i >= 0 {
		if j := bytes.Index(b[i:n], []byte("\r\n")); j >= 0 {
			c.mu.Lock()
			c.passed = true
			c.mu.Unlock()
			return i + j + 2, nil
		}
	}
	return n, err
}

// refreshing reports whether the credentials function was called by rueidis's refresh of a live
// connection's credentials, not for a new connection (rueidis may open more than one).
func refreshing() bool {
	buf := make([]byte, 64<<10)
	return bytes.Contains(buf[:runtime.Stack(buf, false)], []byte("refreshAuth"))
}

func (c *gatedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestFailedReAuthIsNoAnswer: rueidis refreshes credentials (AuthCredentialsFn with a
// RefreshAfter) by sending AUTH on the live connection; when that AUTH fails it retires the
// connection and fails every call still waiting on it with the AUTH's error reply, though those
// calls ran. An acquire that ran that way must be an unknown outcome (ErrUnavailable), undone
// in the background, not a refusal that leaves the lock taken for its whole TTL.
func TestFailedReAuthIsNoAnswer(t *testing.T) {
	ctx := context.Background()
	admin := redistest.Client(t)
	user, pass := "reauth-"+redistest.Name(t), "right-password"
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pass, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })
	scripts.Acquire.Load(ctx, admin)
	scripts.Release.Load(ctx, admin)

	g := &reauthGate{sha: scripts.Acquire.Hash(), authOut: make(chan struct{}), evalSent: make(chan struct{})}
	refresh := make(chan struct{}) // closed by the test: the refresh may go on
	var calls atomic.Int64
	opt := rueidis.ClientOption{
		InitAddress: []string{admin.Options().Addr}, ForceSingleClient: true,
		DisableCache: true, DisableRetry: true, AlwaysPipelining: true,
		PipelineMultiplex: -1, // one connection: the call under test follows the AUTH on it
		AuthCredentialsFn: func(rueidis.AuthCredentialsContext) (rueidis.AuthCredentials, error) {
			switch {
			case calls.Add(1) == 1: // the first connection: refresh soon
				return rueidis.AuthCredentials{Username: user, Password: pass, RefreshAfter: time.Now().Add(100 * time.Millisecond)}, nil
			case refreshing(): // when the test is ready: a password the server no longer takes
				<-refresh
				g.armed.Store(true)
				return rueidis.AuthCredentials{Username: user, Password: "rotated-away"}, nil
			}
			return rueidis.AuthCredentials{Username: user, Password: pass}, nil // other connections
		},
		DialCtxFn: func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			cn, err := d.DialContext(ctx, admin.Options().Network, addr)
			if err != nil {
				return nil, err
			}
			return &gatedConn{Conn: cn, g: g, closed: make(chan struct{})}, nil
		},
	}
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	c := newClient(t, dlockrueidis.New(admin, rc, dlock.WithoutCohort()))
	name := redistest.Name(t)

	// A first lock on the connection, so the call under test is sent at once once the AUTH is
	// out (rueidis's background PING gives up on a connection whose replies stall).
	warm, err := c.Mutex(name + "-warm").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	close(refresh)
	select {
	case <-g.authOut: // written right after the function returns
	case <-time.After(10 * time.Second):
		t.Fatal("rueidis sent no AUTH to refresh the credentials")
	}
	_, err = c.Mutex(name).TryLock(ctx)
	t.Logf("TryLock whose acquire ran behind a failed re-AUTH: %v", err)
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock = %v, want ErrUnavailable (the acquire may have run)", err)
	}
	other := newClient(t, dlock.New(admin))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second) // the acquire's TTL is 30s
	defer cancel()
	l, err := other.Mutex(name).Lock(wctx)
	if err != nil {
		t.Fatalf("lock left held after an acquire answered by a failed re-AUTH: %v", err)
	}
	// The undo released a hold ("r:" + owner in the op log): the acquire had run.
	log := admin.HGetAll(ctx, dlock.DefaultKeyPrefix+"{"+name+"}:log").Val()
	ran := false
	for f := range log {
		ran = ran || strings.HasPrefix(f, "r:")
	}
	if !ran {
		t.Errorf("the acquire did not run (op log %v): the test did not stage what it names", log)
	}
	_ = l.Unlock(ctx)
}
