package dlock

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// LockInfo is a lock's state in Redis, as Client.Inspect and Client.Locks read it. It is a
// snapshot: the lock may change the moment after.
type LockInfo struct {
	Name      string        `json:"name"`
	Held      bool          `json:"held"`
	Owner     string        `json:"owner,omitempty"`      // the holding owner id ("" when free)
	HoldCount int           `json:"hold_count,omitempty"` // the owner's re-entrant holds
	TTL       time.Duration `json:"ttl_ns,omitempty"`     // remaining; -1 when the key has no TTL
	Token     uint64        `json:"token,omitempty"`      // first token of the current hold (0 when free)
	Waiters   int           `json:"waiters"`              // owners queued in Redis (a Client's cohort counts once)
	// Kind is "rwmutex" for a read-write lock held now, "semaphore" for a semaphore held now,
	// "latch" for a latch counting now ("" for a mutex, or anything free).
	Kind string `json:"kind,omitempty"`
	// Readers is how many owners hold a read-write lock to read, or hold permits of a
	// semaphore (then Owner and HoldCount are empty); 0 when it is held to write, or free.
	Readers int `json:"readers,omitempty"`
	// Permits is a held semaphore's number of permits, and PermitsOut how many of them its
	// holders have (a dead holder's count until its TTL runs out).
	Permits    int `json:"permits,omitempty"`
	PermitsOut int `json:"permits_out,omitempty"`
	// Count is a counting latch's count (Kind "latch"); a latch at zero has no state.
	Count int `json:"count,omitempty"`
	// Recent is set when the lock is not held but Redis still keeps its recent use (its op
	// log, for a minute after its last call). A lock neither Held nor Recent, without
	// Waiters, has no state in Redis at all: never taken, or idle past that clean-up window.
	Recent bool `json:"recent,omitempty"`
	// Foreign is set when the lock's key holds something dlock did not write in its current
	// layout: a value of another type, a hash of someone else's, or a lock of another dlock
	// version. Held and TTL are then set, and nothing read from its fields (Owner, Token, ...).
	Foreign bool `json:"foreign,omitempty"`
	// Masters is, for a Redlock Client (NewRedlock), the lock's state on each master in the
	// order given, each naming its Master (address, or "master <i>") and, when it could not be
	// read, the Error. The fields above are then the quorum's view: Held when a quorum of
	// masters hold the lock for one Owner, TTL the time a quorum of them still hold it, Token
	// the highest of their tokens (a lease's token), Waiters the longest queue.
	Masters []LockInfo `json:"masters,omitempty"`
	Master  string     `json:"master,omitempty"`
	Error   string     `json:"error,omitempty"`
}

// Inspect reads the state of the lock called name (with this Client's key prefix) in one
// round trip. A free lock is reported with Held false and Token 0 (a lock leaves no state in
// Redis once free and unwaited for). It returns ErrInvalid for a bad name and the Redis error
// (matching ErrUnavailable when Redis gave no answer) if the read fails. On a Redlock Client
// it reads every master at once (see LockInfo.Masters) and returns the error only when fewer
// than a quorum of them answered, with what the others said. Through a Cluster client that
// sends reads to replicas (ReadOnly), it reads a replica, which may lag the master by the
// replication delay: a view for operators. dlock's own decisions (a latch's count, a
// semaphore's permits, whether a lease is lost) are read on the master.
func (c *Client) Inspect(ctx context.Context, name string) (LockInfo, error) {
	if ctx == nil {
		return LockInfo{}, nilContext("inspect", name)
	}
	if err := c.adminCheck(name); err != nil {
		return LockInfo{}, err
	}
	if c.rl != nil {
		return c.rl.inspect(ctx, name)
	}
	k := lockKeys(c.cfg.keyPrefix(), name)
	var fields *redis.MapStringStringCmd
	var exists, waiters, recent *redis.IntCmd
	var pttl *redis.DurationCmd
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		exists = p.Exists(ctx, k.lock)
		fields = p.HGetAll(ctx, k.lock)
		pttl = p.PTTL(ctx, k.lock)
		waiters = p.ZCard(ctx, k.queue)
		recent = p.Exists(ctx, k.opLog)
		return nil
	})
	if err != nil {
		// Each read must have its answer: a key of another type at one of the lock's names
		// (WRONGTYPE) is one, reported below (Foreign) while the rest read as they are; any
		// other error (no answer, BUSY, NOPERM) fails the whole read rather than show a held
		// lock as free.
		for _, cmd := range []redis.Cmder{exists, fields, pttl, waiters, recent} {
			if err := cmd.Err(); err != nil && !isWrongType(err) {
				return LockInfo{}, redisErr("inspect", name, err)
			}
		}
	}
	info := LockInfo{Name: name, Waiters: int(waiters.Val())}
	if exists.Val() == 0 {
		info.Recent = recent.Val() > 0
		return info, nil
	}
	info.Held, info.TTL = true, pttl.Val()
	f := fields.Val()
	if fields.Err() != nil || f["#v"] != layoutVersion {
		// Another type (WRONGTYPE), a hash dlock did not write, or another layout: none of its
		// fields means here what it means in a lock of this layout.
		info.Foreign = true
		return info, nil
	}
	info.Token, _ = strconv.ParseUint(f["#t"], 10, 64)
	switch f["#k"] {
	case "rw":
		info.Kind = "rwmutex"
	case "sem":
		info.Kind = "semaphore"
		info.Permits, _ = strconv.Atoi(f["#n"])
		info.PermitsOut, _ = strconv.Atoi(f["#u"])
	case "latch":
		info.Kind = "latch"
		info.Count, _ = strconv.Atoi(f["#n"])
		return info, nil // no owner fields
	}
	for field, v := range f {
		if strings.HasPrefix(field, "#") {
			continue // a per-hold or layout field, not an owner
		}
		if f["#m"] == "r" {
			info.Readers++
			continue
		}
		info.Owner = field
		info.HoldCount, _ = strconv.Atoi(v)
	}
	return info, nil
}

// Locks lists the locks under this Client's key prefix whose names match the glob pattern
// ("*" for all) and that have state in Redis, by name: held, waited for, or recently used (a
// lock's keys are gone within a minute of its last use, see docs/DESIGN.md). A lock that is
// free and forgotten is not listed. It uses SCAN (never KEYS), on every master of a Cluster.
// A Redlock Client returns an error matching errors.ErrUnsupported.
func (c *Client) Locks(ctx context.Context, pattern string) ([]LockInfo, error) {
	if ctx == nil {
		return nil, nilContext("list locks", pattern)
	}
	if err := join(c.unsupported("Locks"), c.err); err != nil {
		return nil, err
	}
	if pattern == "" {
		pattern = "*"
	}
	prefix := c.cfg.keyPrefix()
	match := globEscape(prefix) + "{" + pattern + "}*"
	if trailing := len(pattern) - len(strings.TrimRight(pattern, `\`)); trailing%2 == 1 || strings.Contains(pattern, "[") {
		// A lone \ at the end would escape the }, an unclosed [ take it into its class: scan
		// wider, globMatch filters.
		match = globEscape(prefix) + "{*"
	}
	seen := map[string]bool{}
	scan := func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			// The match is wider than the pattern: names may hold "}" ("a}b" has the key
			// P{a}b}, which P{a}* matches), and a key that only looks like dlock's names no
			// lock (P{}).
			if name, ok := lockName(prefix, iter.Val()); ok && validateName(name) == nil && globMatch(pattern, name) {
				seen[name] = true
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		var mu = make(chan struct{}, 1)
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			mu <- struct{}{} // seen is shared by the per-master callbacks
			defer func() { <-mu }()
			return scan(ctx, node)
		})
	} else {
		err = scan(ctx, c.rdb)
	}
	if err != nil {
		return nil, redisErr("list locks", pattern, err)
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	infos := make([]LockInfo, 0, len(names))
	for _, n := range names {
		info, err := c.Inspect(ctx, n)
		if err != nil {
			return nil, err
		}
		infos = append(infos, info)
	}
	return infos, nil
}

// ForceRelease breaks the lock called name whoever holds it, as an operator would with
// redis-cli, but cleanly: the lock goes to the first live waiter, or is freed. The holder's
// Lease ends as lost (Done closes, Err wraps ErrLeaseLost) once it notices, within a
// millisecond when push loss detection is on. It reports whether the lock was held. On a
// Redlock Client it breaks the lock on every master at once and reports whether any held it,
// with the errors of those it could not reach. It deletes whatever is at the name's key, as a
// DEL would: a counting latch opens (its waiters are woken), and a value dlock did not write
// (or one of another dlock version) is removed too.
func (c *Client) ForceRelease(ctx context.Context, name string) (bool, error) {
	if ctx == nil {
		return false, nilContext("force release", name)
	}
	if err := c.adminCheck(name); err != nil {
		return false, err
	}
	if c.rl != nil {
		return c.rl.forceRelease(ctx, name)
	}
	k := lockKeys(c.cfg.keyPrefix(), name)
	n, err := c.runScript(ctx, scripts.ForceRelease, []string{k.lock, k.opLog, k.fence, k.queue, k.live},
		opLogTTL.Milliseconds(), k.channel, grantGrace.Milliseconds(), c.publishCmd).Int()
	if err != nil {
		return false, redisErr("force release", name, err)
	}
	return n == 1, nil
}

func (c *Client) adminCheck(name string) error {
	if c.err != nil {
		return c.err
	}
	return validateName(name)
}

// lockName returns the name of the lock a key belongs to: a lock key ends with "}", its other
// keys with "}" and one of the suffixes of lockKeys (keys.go).
func lockName(prefix, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefix+"{")
	if !ok {
		return "", false
	}
	if name, ok := strings.CutSuffix(rest, "}"); ok {
		return name, true
	}
	for _, suffix := range lockKeySuffixes {
		if name, ok := strings.CutSuffix(rest, "}"+suffix); ok {
			return name, true
		}
	}
	return "", false
}

// globMatch reports whether s matches the glob pattern as Redis's SCAN MATCH has it: * any
// run of bytes, ? one byte, [abc], [^abc] and [a-z] a byte of (or not of) the set, \\x the byte
// x itself. A mismatch after a * retries from that * only, one byte further (the last * is
// the only one worth retrying), so it takes at most len(pattern) × len(s) steps: names come
// from Redis and patterns from users, and the backtracking over every * would be exponential.
func globMatch(pattern, s string) bool {
	p, i := 0, 0
	star, starI := -1, 0 // the last * seen, and where in s its run ends now
	for i < len(s) || p < len(pattern) {
		if p < len(pattern) {
			if pattern[p] == '*' {
				star, starI = p, i
				p++
				continue
			}
			if i < len(s) {
				if width, ok := globOne(pattern[p:], s[i]); ok {
					p += width
					i++
					continue
				}
			}
		}
		if star < 0 || starI >= len(s) {
			return false
		}
		starI++ // the * takes one byte more
		p, i = star+1, starI
	}
	return true
}

// globOne matches the byte c against the pattern element that starts pattern (not a *): it
// returns the element's width and whether c matches it.
func globOne(pattern string, c byte) (width int, ok bool) {
	switch pattern[0] {
	case '?':
		return 1, true
	case '\\':
		if len(pattern) > 1 {
			return 2, pattern[1] == c
		}
		return 1, c == '\\'
	case '[':
		p := pattern[1:]
		not := len(p) > 0 && p[0] == '^'
		if not {
			p = p[1:]
		}
		hit := false
		for len(p) > 0 && p[0] != ']' {
			switch {
			case p[0] == '\\' && len(p) > 1:
				hit = hit || p[1] == c
				p = p[2:]
			case len(p) > 2 && p[1] == '-': // as Redis: "[x-]" is the range x to ]
				// Redis compares a range's bytes as C chars, signed: bytes from 0x80 up sort
				// below 0.
				lo, hi, b := int8(p[0]), int8(p[2]), int8(c)
				if lo > hi {
					lo, hi = hi, lo
				}
				hit = hit || (b >= lo && b <= hi)
				p = p[3:]
			default:
				hit = hit || p[0] == c
				p = p[1:]
			}
		}
		if len(p) > 0 {
			p = p[1:] // the closing ]
		}
		return len(pattern) - len(p), hit != not
	}
	return 1, pattern[0] == c
}

// globEscape escapes the glob metacharacters of a literal for SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ { // bytes: a prefix need not be UTF-8
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// stateFields reads the fields "#k" (the kind), "#v" (the layout) and then more of the dlock
// state at key, in one HMGET: f[0], f[1] and the rest in order. A hash with neither "#k" nor
// "#v" is no dlock state: foreign reports a key that exists all the same (somebody else's
// hash; all nil and foreign false: no state at all). A state made or ended between the reads
// is read again; a key of another type made between them is WRONGTYPE on the next read.
func (c *Client) stateFields(ctx context.Context, key string, more ...string) (f []any, foreign bool, err error) {
	fields := append([]string{"#k", "#v"}, more...)
	if c.replicaReads {
		exists, f, err := c.masterFields(ctx, key, fields...)
		return f, err == nil && exists && f[0] == nil && f[1] == nil, err
	}
	for range 3 {
		if f, err = c.rdb.HMGet(ctx, key, fields...).Result(); err != nil || f[0] != nil || f[1] != nil {
			return f, false, err
		}
		// EXISTS, not HLEN: the minimal ACL (README) has it, as the scripts use it.
		n, err := c.rdb.Exists(ctx, key).Result()
		if err != nil || n == 0 {
			return f, false, err
		}
	}
	return f, true, nil
}

// stateOf reads the state of kind ("#k": "sem" or "latch") at key, for op on the primitive
// called name: its fields "#k", "#v" and more (stateFields), and whether it exists. A key
// holding anything else is refused as the scripts refuse it: another type, a hash dlock did not
// write or one of another kind with ErrInvalid, one of another dlock version (layout) with
// ErrIncompatible; a failed read is the Redis error (matching ErrUnavailable without an answer).
func (c *Client) stateOf(ctx context.Context, op, name, key, kind string, more ...string) (f []any, exists bool, err error) {
	what := kindName(kind)
	f, foreign, err := c.stateFields(ctx, key, more...)
	switch {
	case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
		return nil, false, fmt.Errorf("%w: %q holds a value of another type, not %s", ErrInvalid, name, what)
	case err != nil:
		return nil, false, redisErr(op, name, err)
	case foreign:
		return nil, false, fmt.Errorf("%w: %q holds a hash that is not %s", ErrInvalid, name, what)
	case f[0] == nil && f[1] == nil:
		return f, false, nil
	case str(f[1]) != layoutVersion:
		return nil, false, fmt.Errorf("%w: %q was written by another dlock version (key layout %q, this one's is %q)", ErrIncompatible, name, str(f[1]), layoutVersion)
	case str(f[0]) != kind:
		return nil, false, fmt.Errorf("%w: %q is held as %s, not %s", ErrInvalid, name, kindName(str(f[0])), what)
	}
	return f, true, nil
}

// masterFields reads fields of the hash at key on its master (ReadFields), for a Client whose
// go-redis client reads from replicas: whether the key exists, and the fields' values (nil
// for a missing one).
func (c *Client) masterFields(ctx context.Context, key string, fields ...string) (exists bool, f []any, err error) {
	args := make([]any, len(fields))
	for i, x := range fields {
		args[i] = x
	}
	res, err := c.runScript(ctx, scripts.ReadFields, []string{key}, args...).Slice()
	if err != nil {
		return false, nil, err
	}
	if len(res) != 1+len(fields) {
		return false, nil, fmt.Errorf("dlock: read %q: unexpected reply %v", key, res)
	}
	n, _ := res[0].(int64)
	return n == 1, res[1:], nil
}

// kindName names a lock kind by its "#k" field, as the scripts' DLOCKKIND errors do.
func kindName(k string) string {
	switch k {
	case "":
		return "a mutex"
	case "rw":
		return "a read-write lock"
	case "sem":
		return "a semaphore"
	case "latch":
		return "a latch"
	}
	return "a " + k
}
