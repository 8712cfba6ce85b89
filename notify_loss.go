package dlock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// The loss-detection half of the notifier: watched lock keys, the tracking connection that
// makes Redis push their changes, and the checks that decide a lease is lost.
//
// Only a definite answer from the lock's current master ends a lease. The tracking
// connection's read is a hint: a hold it finds gone is confirmed through the Client's own
// go-redis client, which routes to the current master (it follows MOVED, and a Sentinel
// failover client follows the sentinels). A reply that is not an answer about the key (a
// connection error, LOADING, MOVED, CLUSTERDOWN, ...) leaves the lease as it is and the key is
// read again a little later; the lease's safe deadline stays the backstop.

// watch makes a hold's loss detectable by push: its key is read (and so tracked) trackDelay
// after it was taken. It reports false, watching nothing, when n has retired: the caller asks
// the Client for the node's current notifier.
func (n *notifier) watch(key string, l *hold) bool {
	n.mu.Lock()
	if n.retired {
		n.mu.Unlock()
		return false
	}
	set := n.watched[key]
	if set == nil {
		set = make(map[*hold]uint64)
		n.watched[key] = set
	}
	n.watchSeq++
	set[l] = n.watchSeq
	n.mu.Unlock()
	// Arm tracking a moment later (the hold's timer calls arm): most contended holds end
	// sooner and never cost a read, while a change before the read is still caught by it,
	// well within the 5 ms loss-detection goal.
	l.mu.Lock()
	ended := l.state == holdEnded
	if !ended {
		l.armAt = l.c.now().Add(trackDelay)
		l.resetTimerLocked()
	}
	l.mu.Unlock()
	if ended {
		n.unwatch(key, l)
	}
	return true
}

// arm queues a watched hold's key for its first tracked read.
func (n *notifier) arm(key string, l *hold) {
	n.mu.Lock()
	_, ok := n.watched[key][l]
	if ok {
		n.pending[key] = struct{}{}
	}
	n.mu.Unlock()
	if ok {
		n.poke()
	}
}

func (n *notifier) unwatch(key string, l *hold) {
	n.mu.Lock()
	if set := n.watched[key]; set != nil {
		delete(set, l)
		if len(set) == 0 {
			delete(n.watched, key)
			delete(n.pending, key)
		}
	}
	n.mu.Unlock()
}

func (n *notifier) invalidated(keys []string) {
	n.mu.Lock()
	hit := false
	for _, k := range keys {
		if _, ok := n.watched[k]; ok {
			n.pending[k] = struct{}{}
			hit = true
		}
	}
	n.mu.Unlock()
	if hit {
		n.poke()
	}
}

// repend queues keys (still watched) to be read again.
func (n *notifier) repend(keys []string) {
	n.mu.Lock()
	for _, k := range keys {
		if _, ok := n.watched[k]; ok {
			n.pending[k] = struct{}{}
		}
	}
	n.mu.Unlock()
}

func (n *notifier) watching() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.watched) > 0
}

// checkLoop owns the tracking connection: it turns tracking on (again after every new pub/sub
// connection or connection generation), pings it while keys are watched, reads the keys whose
// state may have changed, and ends the leases they certainly no longer belong to.
func (n *notifier) checkLoop() {
	defer n.wg.Done()
	var trk *redis.Conn
	var trackedEpoch, trackedGen uint64
	closeTrk := func() {
		if trk != nil {
			_ = trk.Close()
			trk = nil
		}
	}
	defer closeTrk()
	sweep := time.NewTicker(idleChannelAfter)
	defer sweep.Stop()
	health := time.NewTicker(healthInterval)
	defer health.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-sweep.C:
			n.unsubscribeIdle()
			continue
		case <-health.C:
			if trk == nil || !n.watching() {
				continue
			}
			ctx, cancel := context.WithTimeout(n.ctx, trackerTimeout)
			err := trk.Ping(ctx).Err()
			cancel()
			if err == nil {
				continue
			}
			// Tracking ended with the connection: open a new one and read every key again.
			closeTrk()
		case <-n.kick:
		case <-retry.C:
		}
		n.mu.Lock()
		skip := n.noTracking || len(n.watched) == 0 // nothing to track: no connection needed
		n.mu.Unlock()
		ep, gen := n.epoch.Load(), n.gen.Load()
		if skip || ep == 0 {
			continue // no pub/sub connection yet: reconnected() pokes when there is one
		}
		if trk == nil || ep != trackedEpoch || gen != trackedGen {
			closeTrk()
			var err error
			trk, err = n.startTracking(n.pubsubID.Load())
			if err != nil || trk == nil {
				trk = nil
				if err != nil {
					// The node may be gone for good (a killed Cluster master): keys whose
					// slot has a new master move to it; the rest are tried again.
					n.moveAll()
					retry.Reset(recheckDelay)
				}
				continue
			}
			trackedEpoch, trackedGen = ep, gen
			n.mu.Lock()
			n.recheckAll = true
			n.mu.Unlock()
		}
		again, err := n.check(trk)
		if err != nil {
			closeTrk()
		}
		if err != nil || again {
			retry.Reset(recheckDelay)
		}
	}
}

// startTracking opens the tracking connection on the current connection generation. It
// returns (nil, nil) when the server does not support or allow CLIENT TRACKING, and an error
// for transient failures.
func (n *notifier) startTracking(redirect int64) (*redis.Conn, error) {
	ctx, cancel := context.WithTimeout(n.ctx, trackerTimeout)
	defer cancel()
	nc, _, _ := n.current()
	trk := nc.Conn()
	err := trk.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", redirect).Err()
	if err == nil {
		return trk, nil
	}
	_ = trk.Close()
	if isRedisReply(err) && !isMissingRedirect(err) && classify(err) == replyOther {
		n.refuse(&n.noTracking, "CLIENT TRACKING", err)
		return nil, nil
	}
	return nil, err
}

// isMissingRedirect reports the error CLIENT TRACKING gives when the pub/sub connection it
// should redirect to has gone; a new one is on its way.
func isMissingRedirect(err error) bool {
	return err != nil && strings.Contains(err.Error(), "redirect")
}

// loss is a hold that looks lost, or whose key the tracking read got no answer about.
type loss struct {
	key     string
	l       *hold
	unknown bool // the tracking read got no answer (LOADING, ASK, ...), not a contradiction
}

// check reads every pending key once on the tracking connection (one pipelined round trip,
// with ROLE first, so a node that is no longer a master is never believed) and confirms the
// holds whose own field ("#" + hold id) is gone: comparing the owner alone would miss a delete
// followed by a new hold of the same owner. Only leases watched before the read was sent are
// judged: a lease acquired meanwhile may not be in what the read returned, and its own watch
// call has queued the key for the next round. It reports whether keys were left to read again
// (no definite answer yet), and an error when the tracking connection failed.
func (n *notifier) check(trk *redis.Conn) (again bool, err error) {
	n.mu.Lock()
	judgeUpTo := n.watchSeq
	var keys []string
	if n.recheckAll {
		n.recheckAll = false
		clear(n.pending)
		for k := range n.watched {
			keys = append(keys, k)
		}
	} else {
		for k := range n.pending {
			keys = append(keys, k)
		}
		clear(n.pending)
	}
	checkRole := !n.noRole
	n.mu.Unlock()
	if len(keys) == 0 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(n.ctx, trackerTimeout)
	defer cancel()
	var role *redis.Cmd
	cmds := make([]*redis.MapStringStringCmd, len(keys))
	_, err = trk.Pipelined(ctx, func(p redis.Pipeliner) error {
		if checkRole {
			role = p.Do(ctx, "ROLE")
		}
		for i, k := range keys {
			cmds[i] = p.HGetAll(ctx, k)
		}
		return nil
	})
	if err != nil && !isRedisReply(err) {
		n.repend(keys)
		return true, err
	}
	if checkRole {
		switch rerr := role.Err(); {
		case isNoPerm(rerr):
			n.refuse(&n.noRole, "ROLE", rerr)
		case rerr == nil && !isMasterRole(role.Val()):
			n.repend(keys)
			n.stale(keys, "the node is not a master")
			return true, nil
		}
	}
	var lost []loss
	var confirmed []*hold
	var moved []string
	var noperm error
	n.mu.Lock()
	for i, k := range keys {
		fields, ferr := cmds[i].Result()
		if ferr != nil && !isWrongType(ferr) {
			// No answer about the key here (LOADING, MOVED, ASK during a slot migration, ...):
			// ask the current master through the main client, which follows MOVED and ASK.
			if strings.HasPrefix(ferr.Error(), "MOVED") {
				moved = append(moved, k)
			}
			if isNoPerm(ferr) {
				noperm = ferr
				continue
			}
			for l, seq := range n.watched[k] {
				if seq <= judgeUpTo {
					lost = append(lost, loss{k, l, true})
				}
			}
			continue
		}
		for l, seq := range n.watched[k] {
			if seq > judgeUpTo {
				continue
			}
			if _, ok := fields["#"+l.holdID]; ok && ferr == nil {
				confirmed = append(confirmed, l)
				continue
			}
			lost = append(lost, loss{k, l, false})
		}
	}
	n.mu.Unlock()
	for _, l := range confirmed {
		l.trackedOnce.Do(func() { close(l.tracked) })
	}
	if noperm != nil {
		n.refuse(&n.noTracking, "HGETALL", noperm)
		return false, nil
	}
	if len(moved) > 0 {
		n.stale(moved, "MOVED")
	}
	if len(lost) > 0 && n.confirmLosses(lost) {
		again = true
	}
	return again, nil
}

// confirmLosses reads the keys of holds that look lost through the Client's go-redis client,
// which reaches the lock's current master, and ends the holds that answer confirms lost. A key
// the master still holds the hold on means this notifier reads a stale node: it re-homes. It
// reports whether keys were left to read again.
func (n *notifier) confirmLosses(lost []loss) (again bool) {
	ctx, cancel := context.WithTimeout(n.ctx, trackerTimeout)
	defer cancel()
	read := n.readHolds(ctx, lost)
	var unknown, stale []string
	for i, x := range lost {
		got, err := read(i)
		switch {
		case isWrongType(err):
			x.l.lose(errTaken)
		case err != nil:
			unknown = append(unknown, x.key) // no answer: ask again; the deadline is the backstop
		case got == readHeld && x.unknown:
			unknown = append(unknown, x.key) // held; read it again where it is tracked
		case got == readHeld:
			stale = append(stale, x.key)
		case got == readGone:
			x.l.lose(errKeyGone)
		default:
			x.l.lose(errTaken)
		}
	}
	n.repend(unknown)
	if len(stale) > 0 {
		n.repend(stale) // read again, on the new connections if the node is re-dialled
		n.stale(stale, "a hold it read as gone is held on the master")
	}
	return len(unknown) > 0 || len(stale) > 0
}

// What the lock's master says of a hold that looks lost.
type holdRead int

const (
	readGone  holdRead = iota // no lock hash at all
	readHeld                  // the hash has the hold's mark
	readTaken                 // the hash has other holds only
)

// readHolds reads, on the lock's current master, the hashes of the holds that look lost, in
// one batch: read(i) says what lost[i]'s key holds of it. Through a go-redis client that reads
// from replicas (which may lag) it reads with a script, which only the master runs.
func (n *notifier) readHolds(ctx context.Context, lost []loss) (read func(i int) (holdRead, error)) {
	if n.c.replicaReads {
		keys := make([][]string, len(lost))
		args := make([][]any, len(lost))
		for i, x := range lost {
			keys[i], args[i] = []string{x.key}, []any{"#" + x.l.holdID}
		}
		cmds := n.c.runBatch(ctx, scripts.ReadFields, keys, args)
		return func(i int) (holdRead, error) {
			res, err := cmds[i].Slice()
			switch {
			case err != nil:
				return 0, err
			case len(res) != 2:
				return 0, fmt.Errorf("dlock: read %q: unexpected reply %v", lost[i].key, res)
			case res[0] == int64(0):
				return readGone, nil
			case res[1] != nil:
				return readHeld, nil
			}
			return readTaken, nil
		}
	}
	cmds := make(map[string]*redis.MapStringStringCmd, len(lost))
	_, _ = n.c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, x := range lost {
			if cmds[x.key] == nil {
				cmds[x.key] = p.HGetAll(ctx, x.key)
			}
		}
		return nil
	})
	return func(i int) (holdRead, error) {
		fields, err := cmds[lost[i].key].Result()
		switch {
		case err != nil:
			return 0, err
		case fields["#"+lost[i].l.holdID] != "":
			return readHeld, nil
		case len(fields) == 0:
			return readGone, nil
		}
		return readTaken, nil
	}
}

// stale handles a notifier whose node gave an answer the current master contradicts, or is not
// a master: on a Cluster the keys go to the notifier of their slot's master; otherwise the
// connections are re-dialled.
func (n *notifier) stale(keys []string, why string) {
	if n.sharded {
		n.moveKeys(keys)
		return
	}
	n.rehome(why)
}

// moveAll offers every watched key to moveKeys (a Cluster only).
func (n *notifier) moveAll() {
	if !n.sharded {
		return
	}
	n.mu.Lock()
	keys := make([]string, 0, len(n.watched))
	for k := range n.watched {
		keys = append(keys, k)
	}
	n.mu.Unlock()
	if len(keys) > 0 {
		n.moveKeys(keys)
	}
}

// moveKeys hands watched keys to the notifier of their slot's current master, asking the
// Cluster client to reload its slot map first; a key whose master the client does not know
// yet stays and is read again a little later.
func (n *notifier) moveKeys(keys []string) {
	cc, ok := n.c.rdb.(*redis.ClusterClient)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, trackerTimeout)
	defer cancel()
	cc.ReloadState(ctx)
	for _, k := range keys {
		to := n.c.notifierFor(ctx, k)
		if to == nil || to == n {
			n.repend([]string{k})
			continue
		}
		n.mu.Lock()
		holds := n.watched[k]
		delete(n.watched, k)
		delete(n.pending, k)
		n.mu.Unlock()
		for h := range holds {
			h.c.watchOn(ctx, to, h)
		}
	}
}

func isMasterRole(v any) bool {
	r, ok := v.([]any)
	return ok && len(r) > 0 && r[0] == "master"
}

func isWrongType(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE")
}
