// Package dlockrueidis runs dlock's Lua scripts on rueidis, whose auto-pipelining serves many
// goroutines' calls with fewer system calls than go-redis: in dlock's benchmark, with 8 or 64
// goroutines sharing one Client on fresh locks, 1.12–1.26× the Lock+Unlock rate of dlock on
// go-redis and 8–17 % less Redis CPU per acquisition; with a lone goroutine 0.82–0.84×
// (docs/BENCHMARKS.md, section 18). It is for processes with many goroutines locking at once.
//
// The scripts (acquire, release, renewal, the multi-lock's and the latch's) are dlock's hot path
// and go through rueidis; everything else stays on the go-redis client the dlock Client is made
// with, which must reach the same deployment: the notification connections (pushed wake-ups and
// lease-loss detection), the Cluster topology, Inspect, and WithReplicaAck's calls, whose script
// and WAIT must share one connection. See dlock.ScriptRunner for the contract.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	rc, err := dlockrueidis.ClientFor(rdb) // or rueidis.NewClient with options of your own
//	if err != nil { ... }
//	defer rc.Close()
//	c := dlockrueidis.New(rdb, rc)
//	defer c.Close(ctx)
package dlockrueidis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// New returns a dlock Client over rdb whose scripts run on rc: dlock.New(rdb, opts...) with
// dlock.WithScriptRunner(RunnerFor(rdb, rc)) appended. rc must reach the deployment rdb
// reaches; Close of the Client closes neither.
func New(rdb redis.UniversalClient, rc rueidis.Client, opts ...dlock.Option) *dlock.Client {
	return dlock.New(rdb, append(opts[:len(opts):len(opts)], dlock.WithScriptRunner(RunnerFor(rdb, rc)))...)
}

// RunnerFor is Runner(rc) with each call waiting for its reply at most rdb's ReadTimeout, as
// go-redis's own calls do: without limit when rdb has none (ReadTimeout -1 or -2), and
// DefaultTimeout when rdb is neither a *redis.Client nor a *redis.ClusterClient.
func RunnerFor(rdb redis.UniversalClient, rc rueidis.Client) dlock.ScriptRunner {
	r := Runner(rc)
	if rr, ok := r.(*runner); ok {
		if t, known := readTimeout(rdb); known {
			rr.timeout = t
		}
	}
	return r
}

// readTimeout is how long rdb waits for a reply (noTimeout for ever), and whether rdb says.
// go-redis's Options, once the client is made, hold 0 or -1 for "no timeout" (set as -1 or -2).
func readTimeout(rdb redis.UniversalClient) (time.Duration, bool) {
	var t time.Duration
	switch r := rdb.(type) {
	case *redis.Client:
		if r == nil {
			return 0, false
		}
		t = r.Options().ReadTimeout
	case *redis.ClusterClient:
		if r == nil {
			return 0, false
		}
		t = r.Options().ReadTimeout
	default:
		return 0, false
	}
	if t <= 0 {
		return noTimeout, true
	}
	return t, true
}

// noTimeout is a runner's timeout when its calls wait for their reply as long as ctx allows.
const noTimeout = time.Duration(math.MaxInt64)

// Runner returns a dlock.ScriptRunner that runs scripts on rc: EVALSHA, then EVAL of the
// source on NOSCRIPT, a batch as one DoMulti per node. On a Cluster each call goes to the node
// dlock names (rc.Nodes()), which returns MOVED and ASK for dlock to follow. Error replies come back as
// errors satisfying redis.Error (but WRONGPASS and NOAUTH as an unknown outcome: rueidis gives
// a failed credentials refresh's reply to calls that ran), a nil reply as redis.Nil, a closed rc as redis.ErrClosed;
// transport errors as rueidis returns them. Make rc with DisableRetry and AlwaysPipelining, as
// ClientFor does: rueidis retries only read-only commands, which dlock's scripts are not, but a
// lock library must never have a write resent behind its back (nor set ConnLifetime, after
// which rueidis resends a call its expired connection did not answer); and without AlwaysPipelining a
// lone call is written on the caller's goroutine to a connection nobody read since the last
// call, so the first call after a server restart fails (unavailable) where go-redis, which checks
// a pooled connection before reusing it, succeeds. A nil rc gives a nil Runner, which dlock reports as
// ErrInvalid. A call waits for its reply at most DefaultTimeout (or its ctx's deadline, if
// sooner), then fails as a timeout: an unknown outcome, as a go-redis read timeout is.
func Runner(rc rueidis.Client) dlock.ScriptRunner {
	if rc == nil {
		return nil
	}
	return &runner{rc: rc, timeout: DefaultTimeout}
}

// DefaultTimeout is how long a Runner's call waits for its reply when the caller's ctx allows
// longer: go-redis's default ReadTimeout. New and RunnerFor use the go-redis client's own.
const DefaultTimeout = 5 * time.Second

type runner struct {
	rc      rueidis.Client
	timeout time.Duration // the longest one call waits for its reply
}

func (r *runner) RunScripts(ctx context.Context, calls []dlock.ScriptCall) []dlock.ScriptResult {
	if dl, ok := ctx.Deadline(); r.timeout != noTimeout && (!ok || time.Until(dl) > r.timeout) {
		// Bound the wait for a reply as go-redis bounds a read (ReadTimeout): without
		// AlwaysPipelining rueidis sends a lone call on the calling goroutine with ctx's
		// deadline on the connection and no longer watches ctx, so a far deadline (or none)
		// would let a call to a frozen server, or one Close cut short, wait it out. It then
		// fails as a timeout, an unknown outcome.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	return r.run(ctx, calls)
}

func (r *runner) run(ctx context.Context, calls []dlock.ScriptCall) []dlock.ScriptResult {
	out := make([]dlock.ScriptResult, len(calls))
	// Calls go out per node, each node's as one pipeline (DoMulti), in the order given.
	var order []string
	byNode := map[string][]int{}
	for i, c := range calls {
		if _, ok := byNode[c.Node]; !ok {
			order = append(order, c.Node)
		}
		byNode[c.Node] = append(byNode[c.Node], i)
	}
	for _, node := range order {
		idx := byNode[node]
		client := r.client(node)
		var cmds rueidis.Commands
		var sent []int // the calls whose commands were built, in order
		for _, i := range idx {
			cmd, err := build(func() rueidis.Completed { return evalsha(client, calls[i]) })
			if err != nil {
				out[i] = dlock.ScriptResult{Err: err}
				continue
			}
			if calls[i].Asking {
				cmds = append(cmds, client.B().Asking().Build())
			}
			cmds, sent = append(cmds, cmd), append(sent, i)
		}
		var res []rueidis.RedisResult
		switch len(cmds) {
		case 0:
			continue
		case 1:
			res = []rueidis.RedisResult{client.Do(ctx, cmds[0])}
		default:
			res = client.DoMulti(ctx, cmds...)
		}
		k := 0
		for _, i := range sent {
			if calls[i].Asking {
				k++ // ASKING's own reply
			}
			out[i] = r.fallback(ctx, client, calls[i], res[k])
			k++
		}
	}
	return out
}

// build builds a command, turning the builder's panic into an error: a rueidis client in
// Cluster mode refuses keys of different slots (a MultiLock's together attempt when the go-redis
// client is not a Cluster's). That one reads as the CROSSSLOT reply a server gives, after which
// dlock takes the members one by one; nothing was sent.
func build(f func() rueidis.Completed) (cmd rueidis.Completed, err error) {
	defer func() {
		if p := recover(); p != nil {
			msg := fmt.Sprint(p)
			if strings.Contains(msg, "different key slots") {
				err = replyError("CROSSSLOT Keys in request don't hash to the same slot (rueidis: " + msg + ")")
			} else {
				err = fmt.Errorf("dlockrueidis: building the command: %s", msg)
			}
		}
	}()
	return f(), nil
}

// client returns the client that sends to node: rc itself when node is "" (not a Cluster), or
// when rueidis does not know the node (yet): its own routing then sends the call to the slot's
// master as it sees it, following redirections itself. It is looked up afresh every time: a
// node client kept from before would hold a connection rueidis may have closed since (a node
// that left and came back), whose ErrClosing would read as the whole client closed.
func (r *runner) client(node string) rueidis.Client {
	if node == "" {
		return r.rc
	}
	if c, ok := r.rc.Nodes()[node]; ok {
		return c
	}
	return r.rc
}

func evalsha(client rueidis.Client, c dlock.ScriptCall) rueidis.Completed {
	return client.B().Evalsha().Sha1(c.SHA1).Numkeys(int64(len(c.Keys))).Key(c.Keys...).Arg(c.Args...).Build()
}

// fallback runs c by EVAL when res says the server has not cached the script (a fresh or
// restarted server, a promoted replica), and converts the result.
func (r *runner) fallback(ctx context.Context, client rueidis.Client, c dlock.ScriptCall, res rueidis.RedisResult) dlock.ScriptResult {
	if re, ok := rueidis.IsRedisErr(res.Error()); ok && re.IsNoScript() {
		eval, err := build(func() rueidis.Completed {
			return client.B().Eval().Script(c.Source).Numkeys(int64(len(c.Keys))).Key(c.Keys...).Arg(c.Args...).Build()
		})
		if err != nil {
			return dlock.ScriptResult{Err: err}
		}
		if c.Asking {
			res = client.DoMulti(ctx, client.B().Asking().Build(), eval)[1]
		} else {
			res = client.Do(ctx, eval)
		}
	}
	return r.result(res)
}

// result converts a rueidis result to go-redis's terms.
func (r *runner) result(res rueidis.RedisResult) dlock.ScriptResult {
	if err := res.Error(); err != nil {
		return dlock.ScriptResult{Err: r.convertErr(err)}
	}
	v, err := res.ToAny()
	if err != nil {
		return dlock.ScriptResult{Err: r.convertErr(err)}
	}
	return dlock.ScriptResult{Val: v}
}

// replyError is an error reply from Redis; it satisfies redis.Error, as go-redis's own do.
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks the error as a reply from Redis (redis.Error).
func (replyError) RedisError() {}

// convertErr converts a rueidis error: a nil reply is redis.Nil, an error reply a replyError
// (but an authentication failure, see isAuthFailure, is no answer), and the client closed
// redis.ErrClosed. rueidis also says ErrClosing to the calls of a
// connection it retires itself (a Sentinel client moving to the new master, a Cluster node
// removed), and ErrNoSlot while it knows no node for a slot: those are no answer, as a broken
// connection is (io.ErrUnexpectedEOF, which dlock reads as unavailable).
func (r *runner) convertErr(err error) error {
	switch {
	case rueidis.IsRedisNil(err):
		return redis.Nil
	case errors.Is(err, rueidis.ErrClosing):
		if r.closed() {
			return fmt.Errorf("%w: %w", redis.ErrClosed, err)
		}
		return fmt.Errorf("dlockrueidis: the call's connection ended before its reply (%w): %w", io.ErrUnexpectedEOF, err)
	case errors.Is(err, rueidis.ErrNoSlot):
		return fmt.Errorf("dlockrueidis: no node for the slot (%w): %w", io.ErrUnexpectedEOF, err)
	}
	if re, ok := rueidis.IsRedisErr(err); ok {
		if msg := re.Error(); isAuthFailure(msg) {
			return fmt.Errorf("dlockrueidis: the connection's authentication failed, and the call may have run (%w): %s", io.ErrUnexpectedEOF, strings.Clone(msg))
		}
		return replyError(strings.Clone(re.Error()))
	}
	return err
}

// isAuthFailure recognises a refusal of AUTH or HELLO by how Redis words one (rueidis drops
// an error's "ERR " prefix): WRONGPASS, NOAUTH, "AUTH <password> called without any password
// configured..." (a password alone, for a default user without one), and before Redis 6
// "invalid password" and "Client sent AUTH, but no password is set". rueidis gives it to every
// call waiting on the connection when a credentials refresh (AuthCredentialsFn with
// RefreshAfter) fails on a live connection, which it then retires: calls written before that
// AUTH, or after it (a failed AUTH leaves the connection as it was), have run, their replies
// unread. So it is no answer about the call, as a broken connection is not. Only openings are
// matched: other replies (NOPERM, an unknown command, MOVED) may quote user, key or host
// names. (A module's own authentication may refuse in words of its own, which this cannot
// know.)
func isAuthFailure(msg string) bool {
	for _, p := range []string{"WRONGPASS", "NOAUTH", "AUTH ", "invalid password", "Client sent AUTH"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// closeProbe bounds the PING that tells a closed rueidis client (which answers ErrClosing at
// once, sending nothing) from an open one.
const closeProbe = 100 * time.Millisecond

// closed reports whether the rueidis client itself is closed.
func (r *runner) closed() bool {
	ctx, cancel := context.WithTimeout(context.Background(), closeProbe)
	defer cancel()
	return errors.Is(r.rc.Do(ctx, r.rc.B().Ping().Build()).Error(), rueidis.ErrClosing)
}

// ClientFor returns a rueidis client for the deployment rdb reaches, with rdb's address (or a
// Cluster's seed addresses), network (TCP or a unix socket), dialer, credentials, database and
// TLS settings, its read or write timeout (the larger) as the connections' timeout, client-side
// caching and retries off, and AlwaysPipelining on: every call then goes through rueidis's
// background pipeline, whose reader notices a connection the server closed (a restart) before
// the next call is written to it, and which watches ctx, so Close can cut a call short. It does not support go-redis's Sentinel
// (failover) clients, Rings, or credentials providers: make those with rueidis.NewClient
// yourself. rueidis connects at once: ClientFor fails when the server cannot be reached.
// Close the client when done.
func ClientFor(rdb redis.UniversalClient) (rueidis.Client, error) {
	opt := rueidis.ClientOption{DisableCache: true, DisableRetry: true, AlwaysPipelining: true}
	switch r := rdb.(type) {
	case *redis.Client:
		o := r.Options()
		opt.ConnWriteTimeout = max(o.ReadTimeout, o.WriteTimeout)
		if o.Addr == "FailoverClient" {
			return nil, errors.New("dlockrueidis: a go-redis Sentinel (failover) client: make the rueidis client with its Sentinel option")
		}
		if o.CredentialsProvider != nil || o.CredentialsProviderContext != nil || o.StreamingCredentialsProvider != nil {
			return nil, errors.New("dlockrueidis: a go-redis client with a credentials provider: make the rueidis client with AuthCredentialsFn")
		}
		opt.InitAddress, opt.Username, opt.Password, opt.SelectDB = []string{o.Addr}, o.Username, o.Password, o.DB
		opt.TLSConfig, opt.ForceSingleClient = o.TLSConfig, true
		if o.Dialer != nil {
			dial := o.Dialer
			opt.DialCtxFn = func(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
				return dial(ctx, o.Network, addr)
			}
		} else if o.Network == "unix" {
			opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
				return d.DialContext(ctx, "unix", addr)
			}
		}
	case *redis.ClusterClient:
		o := r.Options()
		if o.CredentialsProvider != nil || o.CredentialsProviderContext != nil {
			return nil, errors.New("dlockrueidis: a go-redis client with a credentials provider: make the rueidis client with AuthCredentialsFn")
		}
		opt.InitAddress, opt.Username, opt.Password, opt.TLSConfig = o.Addrs, o.Username, o.Password, o.TLSConfig
		opt.ConnWriteTimeout = max(o.ReadTimeout, o.WriteTimeout)
		if o.Dialer != nil {
			dial := o.Dialer
			opt.DialCtxFn = func(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
				return dial(ctx, "tcp", addr)
			}
		}
	case nil:
		return nil, errors.New("dlockrueidis: nil go-redis client")
	default:
		return nil, fmt.Errorf("dlockrueidis: a %T: make the rueidis client with rueidis.NewClient", rdb)
	}
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("dlockrueidis: %w", err)
	}
	return rc, nil
}
