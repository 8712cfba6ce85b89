package dlock

import (
	"context"
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

// ackSuffix names a lock's ack key (same hash tag, so the same node and slot as the lock).
const ackSuffix = ":ack"

// replicaAck is WithReplicaAck's setting; n == 0 means off.
type replicaAck struct {
	n       int
	timeout time.Duration
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
// (otherwise Lock and TryLock return ErrInvalid; n = 0 turns it off). It needs a
// *redis.Client (plain or Sentinel failover) or a *redis.ClusterClient; with another
// UniversalClient acquisitions fail with ErrInvalid. MultiLock takes its members one by one
// under it.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return func(c *config) { c.ack = replicaAck{n: n, timeout: timeout} }
}

func (a replicaAck) validate() error {
	if a.n < 0 || (a.n > 0 && a.timeout < time.Millisecond) {
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

// ackedCall is the outcome of a pipeline sent by runAcked: the script's reply, and how many
// replicas acknowledged (valid when wait is nil).
type ackedCall struct {
	cmd   *redis.Cmd
	acked int64
	wait  error
}

// short reports whether the call's write counts as not acknowledged under a.
func (r ackedCall) short(a replicaAck) bool { return r.wait != nil || r.acked < int64(a.n) }

// runAcked runs script on the node of keys[0] followed, on the same connection, by the ack
// write and WAIT for a. The script's error is in the returned cmd; an error of WAIT (its
// reply lost, say) leaves wait set: the script may have run, but nothing is acknowledged.
func (c *Client) runAcked(ctx context.Context, a replicaAck, script *redis.Script, keys []string, args ...any) (ackedCall, error) {
	node, err := c.ackNode(ctx, keys[0])
	if err != nil {
		return ackedCall{}, err
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
		pipe.Set(ctx, keys[0]+ackSuffix, 1, ackKeyTTL)
		wait := pipe.Do(ctx, "WAIT", a.n, a.timeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if err := cmd.Err(); try == 0 && err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			continue
		}
		n, werr := wait.Int64()
		return ackedCall{cmd: cmd, acked: n, wait: werr}, nil
	}
}

// notReplicated is the error of a write to key (lock name) that a.n replicas did not
// acknowledge: it says how many did and, when the master has fewer connected replicas than
// asked for, that it never could.
func (c *Client) notReplicated(ctx context.Context, name, key string, a replicaAck, r ackedCall) error {
	if r.wait != nil {
		// Not wrapped as ErrUnavailable: the acquisition was undone, and a wait must end rather
		// than retry under a hold id the undo marked given up.
		return fmt.Errorf("%w: lock %q: WAIT failed: %v", ErrNotReplicated, name, r.wait)
	}
	more := ""
	if node, err := c.ackNode(ctx, key); err == nil {
		if info, err := node.Info(ctx, "replication").Result(); err == nil {
			if v := infoValue(info, "connected_slaves"); v != "" {
				more = "; the master has " + v + " connected replicas"
			}
		}
	}
	return fmt.Errorf("%w: lock %q: %d of %d replicas acknowledged within %v%s", ErrNotReplicated, name, r.acked, a.n, a.timeout, more)
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
