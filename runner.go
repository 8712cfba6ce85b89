package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// A ScriptRunner runs dlock's Lua scripts (acquire, release, renewal, the latch's and
// multi-lock's) through another Redis client library, chosen with WithScriptRunner:
// dlockrueidis runs them on rueidis, whose auto-pipelining serves many goroutines' calls with
// fewer system calls. It is a transport only: the go-redis client given to New stays the one
// that knows the deployment, and must reach the same one. On a Cluster it maps each lock to its
// master (every call names its node) and dlock follows MOVED and ASK replies itself, so both
// clients always agree on where a lock lives. Everything else stays on go-redis: the
// notification connections (wake-ups and lease-loss pushes), Inspect, WithReplicaAck's calls
// (the script and its WAIT must share a connection), a Redlock's masters.
type ScriptRunner interface {
	// RunScripts runs each call, in order, and returns one result per call: EVALSHA of its
	// SHA1, then EVAL of its Source when the server has not cached the script (NOSCRIPT). A call
	// with a Node goes to that node (its address as go-redis knows it, "host:port"), preceded
	// there by ASKING when Asking is set, and a MOVED or ASK reply is returned, not followed;
	// a call without one goes where the client's own routing sends it. The calls may go out
	// together (pipelined); ctx bounds them all, and a call cut short by ctx may still run. A
	// runner must not resend a call after a transport failure: the script may have run with
	// its reply lost, and dlock decides what that means. A failure to open a connection (a
	// *net.OpError whose Op is "dial", naming the address dialled) must mean the call was not
	// sent: dlock then sends it again, for up to 1.5 s, on a Cluster to the slot's new master
	// once a slot map names one (through go-redis, if the runner goes elsewhere).
	RunScripts(ctx context.Context, calls []ScriptCall) []ScriptResult
}

// A ScriptCall is one script to run: its SHA-1 (hex) and source, its keys and arguments, and
// on a Cluster the node to run it on.
type ScriptCall struct {
	SHA1, Source string
	Keys, Args   []string
	Node         string // a Cluster node's address, or "" (not a Cluster)
	Asking       bool   // send ASKING first: Node is the target of a slot migration (an ASK reply)
}

// A ScriptResult is one script's reply or error, in go-redis's terms, which is how dlock reads
// them: a reply is an int64, a string, or a []any of replies; a nil reply is the error
// redis.Nil. An error reply (WRONGTYPE, NOPERM, MOVED, LOADING, a script's own error) must
// satisfy redis.Error, so dlock tells Redis's answers (nothing changed) from transport failures
// and timeouts (the script may have run), which are returned as they are (a net.Error, io.EOF,
// a context error). A closed client is redis.ErrClosed.
type ScriptResult struct {
	Val any
	Err error
}

// WithScriptRunner runs dlock's Lua scripts through r instead of the go-redis client given to
// New (see ScriptRunner for what stays on go-redis). Scripts under WithReplicaAck stay on
// go-redis. A nil r is reported as ErrInvalid by every lock call. It is a Client option: given
// to Client.Mutex it has no effect.
func WithScriptRunner(r ScriptRunner) Option {
	return func(c *config) {
		c.runner = r
		c.runnerSet = true
	}
}

// withoutScriptRunner drops a WithScriptRunner given before it: a Redlock's masters never share
// one (NewRedlock refuses it).
func withoutScriptRunner() Option {
	return func(c *config) { c.runner, c.runnerSet = nil, false }
}

// isNilRunner reports a nil runner, or a nil pointer in the interface.
func isNilRunner(r ScriptRunner) bool {
	if r == nil {
		return true
	}
	v := reflect.ValueOf(r)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// testRunner, when set (only by tests, export_test.go), gives a Client made without
// WithScriptRunner its runner, so the whole test suite runs through another client library.
var testRunner func(redis.UniversalClient) ScriptRunner

// maxRedirects bounds the MOVED and ASK replies one script call follows, as go-redis's
// ClusterOptions.MaxRedirects does by default.
const maxRedirects = 3

// runScript runs s with keys and args through the Client's runner, or through its go-redis
// client when it has none.
func (c *Client) runScript(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if c.runner == nil {
		return s.Run(ctx, c.rdb, keys, args...)
	}
	call := scriptCall(s, keys, args)
	r := c.runRouted(ctx, call)
	return redis.NewCmdResult(r.Val, r.Err)
}

// runScripts runs a batch of calls of s (one per keys[i], args[i]) through the Client's
// runner, pipelined; without one, it returns nil (runBatch pipelines on go-redis then).
func (c *Client) runScripts(ctx context.Context, s *redis.Script, keys [][]string, args [][]any) []*redis.Cmd {
	if c.runner == nil {
		return nil
	}
	calls := make([]ScriptCall, len(keys))
	unrouted := make([]bool, len(keys)) // no node for its key: its result is the error
	rs := make([]ScriptResult, len(keys))
	for i := range keys {
		calls[i] = scriptCall(s, keys[i], args[i])
		if err := c.route(ctx, &calls[i]); err != nil {
			rs[i], unrouted[i] = ScriptResult{Err: err}, true
		}
	}
	var batch []ScriptCall
	var at []int
	for i := range calls {
		if !unrouted[i] {
			batch, at = append(batch, calls[i]), append(at, i)
		}
	}
	if len(batch) > 0 {
		got := c.runner.RunScripts(ctx, batch)
		for j, i := range at {
			if j >= len(got) {
				rs[i] = ScriptResult{Err: fmt.Errorf("dlock: script runner returned %d results for %d calls", len(got), len(batch))}
				continue
			}
			rs[i] = got[j]
		}
		c.settle(ctx, calls, rs, at)
	}
	cmds := make([]*redis.Cmd, len(calls))
	for i, r := range rs {
		cmds[i] = redis.NewCmdResult(r.Val, r.Err)
	}
	return cmds
}

// runBatch runs a batch of calls of s (one per keys[i], args[i]) in one round trip per node:
// through the Client's runner, or pipelined on go-redis (which on a Cluster sends each call to
// its key's node and follows MOVED and ASK), a call answered NOSCRIPT then run again with its
// source. Each call's reply or error is its own; a transport failure fails the calls it cut
// short, which may still have run.
func (c *Client) runBatch(ctx context.Context, s *redis.Script, keys [][]string, args [][]any) []*redis.Cmd {
	if len(keys) == 0 {
		return nil
	}
	if cmds := c.runScripts(ctx, s, keys, args); cmds != nil {
		return cmds
	}
	cmds := make([]*redis.Cmd, len(keys))
	_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range keys {
			cmds[i] = s.EvalSha(ctx, p, keys[i], args[i]...)
		}
		return nil
	})
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			cmds[i] = s.Eval(ctx, c.rdb, keys[i], args[i]...)
		}
	}
	return cmds
}

// runRouted runs one call on its node (on a Cluster, the master go-redis maps its key to),
// following redirections.
func (c *Client) runRouted(ctx context.Context, call ScriptCall) ScriptResult {
	if err := c.route(ctx, &call); err != nil {
		return ScriptResult{Err: err}
	}
	calls, rs := []ScriptCall{call}, []ScriptResult{c.runOne(ctx, call)}
	c.settle(ctx, calls, rs, []int{0})
	return rs[0]
}

// settle does for the calls at idx, which the runner has run into rs, what go-redis does for
// its own calls: it sends again those whose connection could not be opened (resendUnsent),
// follows MOVED and ASK (follow), and sends again, after a back-off, those Redis refused
// without running them (refusedBeforeRunning: a server still loading its data, a demoted
// master, a slot being migrated), up to as many times as the go-redis client's own retries
// (retryPolicy), on a Cluster routed afresh.
func (c *Client) settle(ctx context.Context, calls []ScriptCall, rs []ScriptResult, idx []int) {
	retries, minBackoff, maxBackoff := c.retryPolicy()
	var giveUp time.Time // for dial failures, over every pass: rerouteFor from the first
	unsentWait := rerouteFirstWait
	for attempt := 0; ; attempt++ {
		c.resendUnsent(ctx, calls, rs, &giveUp)
		var refused []int
		unsent := false
		for _, i := range idx {
			if _, _, ok := redirect(rs[i].Err); ok {
				rs[i] = c.follow(ctx, calls[i], rs[i]) // the slot moved: this call alone, redirected
				// A redirect to a node that cannot be dialled (a killed master the redirecting
				// node still names): routed afresh by resendUnsent, as any unsent call.
				unsent = unsent || (calls[i].Node != "" && dialFailed(rs[i].Err))
			}
			if refusedBeforeRunning(rs[i].Err) {
				refused = append(refused, i)
			}
		}
		if unsent && (len(refused) == 0 || attempt >= retries) {
			// Waited for as resendUnsent waits for a stuck call: the redirecting node and the
			// slot map may name the dead node (or each other) until the failover. Calls still
			// refused after their last retry are not sent again: their refusal stands.
			if giveUp.IsZero() {
				giveUp = time.Now().Add(rerouteFor)
			}
			if time.Now().Add(unsentWait).Before(giveUp) && c.resendWait(ctx, unsentWait) == nil {
				unsentWait = min(2*unsentWait, rerouteFor/4)
				attempt-- // not a retry of a refusal
				continue
			}
		}
		if len(refused) == 0 || attempt >= retries {
			return
		}
		if c.resendWait(ctx, retryBackoff(attempt, minBackoff, maxBackoff)) != nil {
			return // the refusal stands: the ctx ended, or the Client closed (a lock call)
		}
		c.topologyMayHaveChanged(ctx) // a READONLY node is a demoted master
		for _, i := range refused {
			if calls[i].Node != "" && c.route(ctx, &calls[i]) == nil {
				calls[i].Asking = false
			}
		}
		c.runAt(ctx, calls, rs, refused, false)
	}
}

// refusedBeforeRunning reports an error reply with which Redis refused a call without running
// it, one go-redis sends its own calls again on.
func refusedBeforeRunning(err error) bool {
	if err == nil || !isRedisReply(err) {
		return false
	}
	msg := err.Error()
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS"} {
		if strings.HasPrefix(msg, p+" ") || msg == p {
			return true
		}
	}
	// rueidis drops an error reply's "ERR " prefix.
	return strings.HasPrefix(strings.TrimPrefix(msg, "ERR "), "max number of clients reached")
}

// retryPolicy is how the go-redis client sends its own refused calls again: how many times, and
// the least and most back-off (its options, as go-redis has filled in their defaults).
func (c *Client) retryPolicy() (retries int, minBackoff, maxBackoff time.Duration) {
	switch r := c.rdb.(type) {
	case *redis.Client:
		o := r.Options()
		return o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff
	case *redis.ClusterClient:
		o := r.Options()
		return o.MaxRedirects, o.MinRetryBackoff, o.MaxRetryBackoff
	}
	return 3, 10 * time.Millisecond, time.Second // go-redis's defaults (v9.22)
}

// retryBackoff is the wait before retry number attempt (from 0): at least minBackoff, at most
// maxBackoff, otherwise random below minBackoff × (2^attempt + 1), about as go-redis waits.
func retryBackoff(attempt int, minBackoff, maxBackoff time.Duration) time.Duration {
	if minBackoff <= 0 {
		return 0
	}
	span := minBackoff << min(attempt, 30)
	if span <= 0 || span > maxBackoff {
		span = maxBackoff
	}
	if span <= 0 {
		return minBackoff
	}
	return min(minBackoff+rand.N(span), max(maxBackoff, minBackoff))
}

// follow follows the MOVED or ASK reply r to call, up to maxRedirects times, as go-redis does:
// MOVED also has go-redis reload its slot map, so later calls and the notifications go to the
// slot's new master.
func (c *Client) follow(ctx context.Context, call ScriptCall, r ScriptResult) ScriptResult {
	for range maxRedirects {
		addr, ask, ok := redirect(r.Err)
		if !ok || call.Node == "" {
			return r
		}
		if !ask {
			c.topologyMayHaveChanged(ctx)
		}
		call.Node, call.Asking = addr, ask
		r = c.runOne(ctx, call)
	}
	return r
}

const (
	rerouteFirstWait = 10 * time.Millisecond
	rerouteFor       = 1500 * time.Millisecond // how long calls whose dial failed are tried again
)

// resendUnsent sends again the calls whose connection could not be opened (rs[i] a dial
// failure: nothing was sent, see ScriptRunner), which on a Cluster is a killed master that a
// slot map still names: go-redis's, whose reload waits for a node that has seen the promotion,
// or the runner's own. Until *giveUp (set to rerouteFor from now if zero, when there is such a
// call), or until ctx ends (for a lock call, or the Client closes: resendWait), leaving the
// dial failure, it has go-redis reload its map and sends each such call again:
//   - where go-redis's map names another node for it now (a batch's calls together);
//   - through go-redis's client of its node when the runner sent it elsewhere (the runner does
//     not know the promoted replica yet);
//   - else, after a wait, by the runner's own routing (Node ""), whose map may be the fresher.
//
// go-redis does the same for its own calls.
func (c *Client) resendUnsent(ctx context.Context, calls []ScriptCall, rs []ScriptResult, giveUp *time.Time) {
	wait := rerouteFirstWait
	slept := false
	var viaGoRedis []bool // sent through go-redis once: not again (a dialled address may be a name's IP)
	for {
		var again, direct, stuck []int
		for i := range rs {
			if calls[i].Node == "" || !dialFailed(rs[i].Err) {
				continue
			}
			asked := calls[i].Node
			if c.route(ctx, &calls[i]) != nil {
				stuck = append(stuck, i)
				continue
			}
			calls[i].Asking = false
			switch dialed := dialAddr(rs[i].Err); {
			case calls[i].Node != asked:
				again = append(again, i)
			case dialed != "" && dialed != asked && (viaGoRedis == nil || !viaGoRedis[i]):
				if viaGoRedis == nil {
					viaGoRedis = make([]bool, len(rs))
				}
				viaGoRedis[i] = true
				direct = append(direct, i)
			default:
				stuck = append(stuck, i)
			}
		}
		if len(again)+len(direct)+len(stuck) == 0 {
			return
		}
		if giveUp.IsZero() {
			*giveUp = time.Now().Add(rerouteFor)
		}
		if time.Now().After(*giveUp) {
			return
		}
		c.topologyMayHaveChanged(ctx) // go-redis rate-limits its reloads
		switch {
		case len(again)+len(direct) > 0:
			c.runAt(ctx, calls, rs, again, false)
			for _, i := range direct {
				rs[i] = c.runOnGoRedis(ctx, calls[i])
			}
		case slept:
			c.runAt(ctx, calls, rs, stuck, true)
		default:
			if time.Now().Add(wait).After(*giveUp) {
				return
			}
			if c.resendWait(ctx, wait) != nil {
				return // the ctx ended, or the Client closed (a lock call)
			}
			wait = min(2*wait, rerouteFor/4)
			slept = true
			continue
		}
		slept = false
	}
}

// surelyUnsent reports whether err, from a call the runner ran, says nothing was sent: a dial
// failure, by the ScriptRunner contract. Only for the runner's calls: go-redis's own may have
// been sent before a retry's dial failed (a Client's MaxRetries), so theirs say nothing. (A
// runner's call resent through go-redis, resendUnsent, is sent once: a Cluster's node clients
// do not retry unless ClusterOptions.MaxRetries is set.)
func surelyUnsent(err error) bool {
	return dialFailed(err)
}

// endsOnClose marks the ctx of a lock call (see lockCall).
type endsOnClose struct{}

// lockCall marks ctx as a lock call's, whose resends (settle, with a runner) end when the
// Client closes, as Close promises its waiting callers. Other calls are resent while their ctx
// allows: Close's own releases run after the Client has closed, and must still reach a slot's
// new master.
func (c *Client) lockCall(ctx context.Context) context.Context {
	if c.runner == nil {
		return ctx
	}
	return context.WithValue(ctx, endsOnClose{}, true)
}

// resendWait waits d before settle sends calls again: until ctx ends, and for a lock call
// (lockCall) until the Client closes.
func (c *Client) resendWait(ctx context.Context, d time.Duration) error {
	var closed <-chan struct{} // nil: never
	if ctx.Value(endsOnClose{}) != nil {
		closed = c.bg.Done()
	}
	return sleepUntil(ctx, closed, d)
}

// runAt runs the calls at idx through the runner, together, into rs; unrouted, they go where
// the runner's own routing sends them (their Node kept for what follows).
func (c *Client) runAt(ctx context.Context, calls []ScriptCall, rs []ScriptResult, idx []int, unrouted bool) {
	if len(idx) == 0 {
		return
	}
	batch := make([]ScriptCall, len(idx))
	for j, i := range idx {
		batch[j] = calls[i]
		if unrouted {
			batch[j].Node = ""
		}
	}
	got := c.runner.RunScripts(ctx, batch)
	for j, i := range idx {
		if j < len(got) {
			rs[i] = got[j]
		} else {
			rs[i] = ScriptResult{Err: fmt.Errorf("dlock: script runner returned %d results for %d calls", len(got), len(batch))}
		}
	}
}

// runOnGoRedis runs call on go-redis's client of the master its key maps to, when that is
// call.Node (EVALSHA, then EVAL on NOSCRIPT); otherwise, the map having changed since, it runs
// it through the runner, whose dial failure resendUnsent then routes afresh.
func (c *Client) runOnGoRedis(ctx context.Context, call ScriptCall) ScriptResult {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok {
		return c.runOne(ctx, call)
	}
	node, err := cc.MasterForKey(ctx, call.Keys[0])
	if err != nil {
		return ScriptResult{Err: err}
	}
	if node.Options().Addr != call.Node {
		return c.runOne(ctx, call)
	}
	args := make([]any, len(call.Args))
	for i, a := range call.Args {
		args[i] = a
	}
	cmd := node.EvalSha(ctx, call.SHA1, call.Keys, args...)
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		cmd = node.Eval(ctx, call.Source, call.Keys, args...)
	}
	return ScriptResult{Val: cmd.Val(), Err: cmd.Err()}
}

// dialAddr returns the address of a failed dial in err, or "".
func dialAddr(err error) string {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" || op.Addr == nil {
		return ""
	}
	return op.Addr.String()
}

// dialFailed reports whether err says a connection could not be opened, so nothing was sent.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func (c *Client) runOne(ctx context.Context, call ScriptCall) ScriptResult {
	r := c.runner.RunScripts(ctx, []ScriptCall{call})
	if len(r) != 1 {
		return ScriptResult{Err: fmt.Errorf("dlock: script runner returned %d results for 1 call", len(r))}
	}
	return r[0]
}

// route names the node of call on a Cluster: the master go-redis maps its first key to.
func (c *Client) route(ctx context.Context, call *ScriptCall) error {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	node, err := cc.MasterForKey(ctx, call.Keys[0])
	if err != nil {
		return err
	}
	call.Node = node.Options().Addr
	return nil
}

// redirect parses a MOVED or ASK error reply: the address it names, and whether it is ASK.
func redirect(err error) (addr string, ask, ok bool) {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return "", false, false
	}
	msg := rerr.Error()
	switch {
	case strings.HasPrefix(msg, "MOVED "):
	case strings.HasPrefix(msg, "ASK "):
		ask = true
	default:
		return "", false, false
	}
	f := strings.Fields(msg)
	if len(f) != 3 {
		return "", false, false
	}
	return f[2], ask, true
}

func scriptCall(s *redis.Script, keys []string, args []any) ScriptCall {
	a := make([]string, len(args))
	for i, v := range args {
		a[i] = scriptArg(v)
	}
	return ScriptCall{SHA1: s.Hash(), Source: scripts.Source(s), Keys: keys, Args: a}
}

// scriptArg writes an argument as go-redis does, for the types dlock's calls pass.
func scriptArg(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	case bool:
		if v {
			return "1"
		}
		return "0"
	case time.Duration:
		return strconv.FormatInt(int64(v), 10)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}
