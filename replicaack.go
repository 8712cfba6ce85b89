package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replica acknowledgement (WithReplicaAck): a lease counts only once replicas of the lock's
// master have the write that took or renewed it.
//
// WAIT counts the replicas that acknowledged the replication offset of its own connection's
// last write, so it proves something only on the connection that wrote. Every acked call is
// therefore one pipeline on one connection to the lock's master: the script, a write that is
// always replicated (SET of the lock's ack key, which expires at once), and WAIT. The offset is
// the server's, one stream for all connections, so the ack write covers what the script wrote
// and whatever another connection wrote before it: a hold a release granted to this caller,
// or a hold a retried script found already written by its lost first send. A failover between
// the script and the WAIT breaks the connection, so the answer never mixes two masters.

// ackKeyTTL is how long an ack key lives: it only needs to be written.
const ackKeyTTL = time.Millisecond

// ackReadMargin is how far below the client's ReadTimeout an acknowledgement's timeout must
// stay: the reply comes a little after the timeout.
const ackReadMargin = 100 * time.Millisecond

// ackSuffix names a lock's ack key (same hash tag, so the same node and slot as the lock).
const ackSuffix = ":ack"

// replicaAck is WithReplicaAck's or WithReplicaAckAOF's setting; off when it waits for nothing.
type replicaAck struct {
	n       int // replicas
	timeout time.Duration
	aof     bool // WAITAOF: acknowledged means fsynced to the append-only file
	local   bool // WAITAOF waits for the master's own fsync too
}

// on reports whether writes wait for an acknowledgement.
func (a replicaAck) on() bool { return a.n > 0 || a.local }

// send queues, after a write to key on pipe, the ack write and the wait for a.
func (a replicaAck) send(ctx context.Context, pipe redis.Pipeliner, key string) *redis.Cmd {
	pipe.Set(ctx, key+ackSuffix, 1, ackKeyTTL)
	if a.aof {
		local := 0
		if a.local {
			local = 1
		}
		return pipe.Do(ctx, "WAITAOF", local, a.n, a.timeout.Milliseconds())
	}
	return pipe.Do(ctx, "WAIT", a.n, a.timeout.Milliseconds())
}

// ackReply is what WAIT or WAITAOF answered: the replicas that acknowledged, whether the
// master's own fsync did (WAITAOF), or the error that left nothing acknowledged.
type ackReply struct {
	replicas int64
	local    bool
	err      error
}

// read parses the reply of the command send queued under a.
func (a replicaAck) read(cmd *redis.Cmd) ackReply {
	if !a.aof {
		n, err := cmd.Int64()
		return ackReply{replicas: n, err: err}
	}
	v, err := cmd.Int64Slice()
	if err != nil {
		// Redis before 7.2 has no WAITAOF; a local fsync needs appendonly yes. The setting
		// cannot work with this server: ErrInvalid (what the caller asked for) and
		// ErrIncompatible (the server's fault, which Redlock counts against that master).
		switch msg := err.Error(); {
		case strings.Contains(msg, "unknown command"):
			err = fmt.Errorf("%w: %w: WithReplicaAckAOF needs WAITAOF, Redis 7.2 or later: %v", ErrInvalid, ErrIncompatible, err)
		case strings.Contains(msg, "appendonly"):
			err = fmt.Errorf("%w: %w: WithReplicaAckAOF(local true) needs appendonly yes on the master: %v", ErrInvalid, ErrIncompatible, err)
		}
		return ackReply{err: err}
	}
	if len(v) != 2 {
		return ackReply{err: fmt.Errorf("unexpected WAITAOF reply %v", v)}
	}
	return ackReply{local: v[0] > 0, replicas: v[1]}
}

// short reports whether r leaves a write not acknowledged as a asks.
func (a replicaAck) short(r ackReply) bool {
	return r.err != nil || r.replicas < int64(a.n) || (a.local && !r.local)
}

// WithReplicaAck makes every acquisition, extending re-entry, renewal and grant count only once
// n replicas of the lock's master acknowledged it within timeout (Redis WAIT, sent on the same
// connection as the write). An acquisition not acknowledged in time is undone (the hold is
// released) and returns an error matching ErrNotReplicated; a renewal not acknowledged counts
// as not renewed, so the lease ends at its safe deadline unless a later renewal is
// acknowledged; Lease.Extend returns ErrNotReplicated and leaves the deadline as it was.
//
// What it guarantees: when a lease is handed out, n replicas had received the hold. What it
// does not: WAIT is not consensus. A replica that acknowledged may still lose the write (it
// restarts without persistence), and a failover may promote a replica that did not
// acknowledge (with n smaller than the number of replicas); writes are not rolled back when the
// ack fails, the release that undoes them is. n must be at least 1 and timeout positive
// and at least 100ms below the go-redis client's ReadTimeout (5s by default), which bounds the
// pipeline's read (otherwise Lock and TryLock return ErrInvalid; n = 0 turns it off). It needs a
// *redis.Client (plain or Sentinel failover) or a *redis.ClusterClient; with another
// UniversalClient acquisitions fail with ErrInvalid. MultiLock takes its members one by one
// under it.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return func(c *config) {
		c.ack = replicaAck{n: n, timeout: timeout}
		if n == 0 {
			c.ack = replicaAck{} // off: the same setting as never asking
		}
	}
}

// WithReplicaAckAOF is WithReplicaAck with a stronger acknowledgement: n replicas fsynced the
// write to their append-only file (Redis WAITAOF), and, when local is true, so did the lock's
// master, all within timeout. A replica that acknowledged then keeps the hold across its own
// restart. Only replicas with appendonly yes ever acknowledge (the others never fsync an AOF),
// and with appendfsync everysec the timeout must allow for a second. Everything else is as for
// WithReplicaAck, whose setting it replaces (the last of the two options wins). It needs
// Redis 7.2 or later, and appendonly yes on the master when local is true: otherwise
// acquisitions are undone and return an error matching both ErrInvalid and ErrIncompatible
// that names what is missing (a Redlock counts it as that master's fault). n must be at least 0,
// timeout at least 1ms, and it must wait for something (n >= 1 or local); otherwise Lock and
// TryLock return ErrInvalid.
func WithReplicaAckAOF(local bool, n int, timeout time.Duration) Option {
	return func(c *config) { c.ack = replicaAck{n: n, timeout: timeout, aof: true, local: local} }
}

func (a replicaAck) validate() error {
	switch {
	case a.aof && (a.n < 0 || !a.on() || a.timeout < time.Millisecond):
		return fmt.Errorf("%w: WithReplicaAckAOF(%v, %d, %v): needs n >= 0, n >= 1 or local, and a timeout of at least 1ms", ErrInvalid, a.local, a.n, a.timeout)
	case !a.aof && (a.n < 0 || (a.n > 0 && a.timeout < time.Millisecond)):
		return fmt.Errorf("%w: WithReplicaAck(%d, %v): needs n >= 0 and a timeout of at least 1ms", ErrInvalid, a.n, a.timeout)
	}
	return nil
}

// ackNode returns the client of the node that holds key, on which one pipeline is one
// connection: the Client's own *redis.Client, or a Cluster's master for the key's slot.
func (c *Client) ackNode(ctx context.Context, key string) (*redis.Client, error) {
	switch r := c.rdb.(type) {
	case *redis.Client:
		return r, nil
	case *redis.ClusterClient:
		node, err := r.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node, nil
	}
	return nil, fmt.Errorf("%w: WithReplicaAck needs a *redis.Client or *redis.ClusterClient, not %T", ErrInvalid, c.rdb)
}

// ackedCall is the outcome of a pipeline sent by runAcked: the script's reply, and the
// acknowledgement's.
type ackedCall struct {
	cmd  *redis.Cmd
	ack  ackReply
	node *redis.Client // the node it went to
}

// short reports whether the call's write counts as not acknowledged under a.
func (r ackedCall) short(a replicaAck) bool { return a.short(r.ack) }

// runAcked runs script on the node of keys[0] followed, on the same connection, by the ack
// write and WAIT (or WAITAOF) for a. The script's error is in the returned cmd; an error of
// the wait (its reply lost, say) is in the ack reply: the script may have run, but nothing is
// acknowledged.
func (c *Client) runAcked(ctx context.Context, a replicaAck, script *redis.Script, keys []string, args ...any) (ackedCall, error) {
	node, err := c.ackNode(ctx, keys[0])
	if err != nil {
		return ackedCall{}, err
	}
	if rt := node.Options().ReadTimeout; rt > 0 && a.timeout > rt-ackReadMargin {
		// go-redis reads a pipeline's replies with ReadTimeout, whatever the wait's own timeout:
		// the read would time out first and the pipeline be resent.
		return ackedCall{}, fmt.Errorf("%w: %s timeout %v: must be at least %v below the client's ReadTimeout (%v)", ErrInvalid, a.command(), a.timeout, ackReadMargin, rt)
	}
	// EVALSHA first; a server that has not cached the script (a fresh or promoted master) gets
	// it with EVAL, as redis.Script.Run does, which needs no SCRIPT LOAD permission.
	for try := 0; ; try++ {
		pipe := node.Pipeline()
		var cmd *redis.Cmd
		if try == 0 {
			cmd = script.EvalSha(ctx, pipe, keys, args...)
		} else {
			cmd = script.Eval(ctx, pipe, keys, args...)
		}
		wait := a.send(ctx, pipe, keys[0])
		_, _ = pipe.Exec(ctx)
		if err := cmd.Err(); try == 0 && err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			continue
		}
		return ackedCall{cmd: cmd, ack: a.read(wait), node: node}, nil
	}
}

// notReplicated is the error of a write to key (lock name) that was not acknowledged as a
// asks: it says how many replicas did and, when the master has fewer connected replicas than
// asked for, that it never could. A server that cannot answer the wait at all (no WAITAOF)
// gives ErrInvalid.
func (c *Client) notReplicated(ctx context.Context, name, key string, a replicaAck, r ackedCall) error {
	if err := r.ack.err; err != nil {
		if errors.Is(err, ErrInvalid) {
			return fmt.Errorf("lock %q: %w", name, err)
		}
		// Not wrapped as ErrUnavailable: the acquisition was undone, and a wait must end rather
		// than retry under a hold id the undo marked given up.
		return fmt.Errorf("%w: lock %q: %s failed: %v", ErrNotReplicated, name, a.command(), err)
	}
	more := ""
	if node, err := c.ackNode(ctx, key); err == nil {
		if info, err := node.Info(ctx, "replication").Result(); err == nil {
			if v := infoValue(info, "connected_slaves"); v != "" {
				more = "; the master has " + v + " connected replicas"
			}
		}
	}
	if a.aof {
		return fmt.Errorf("%w: lock %q: %d of %d replicas fsynced it to their AOF within %v (the master's own fsync: %v, asked: %v)%s; only replicas with appendonly yes count, and appendfsync everysec needs a timeout of about a second",
			ErrNotReplicated, name, r.ack.replicas, a.n, a.timeout, r.ack.local, a.local, more)
	}
	return fmt.Errorf("%w: lock %q: %d of %d replicas acknowledged within %v%s", ErrNotReplicated, name, r.ack.replicas, a.n, a.timeout, more)
}

// command names the wait a sends.
func (a replicaAck) command() string {
	if a.aof {
		return "WAITAOF"
	}
	return "WAIT"
}

// infoValue returns field's value in an INFO reply, or "".
func infoValue(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
