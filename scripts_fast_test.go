package dlock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// The fast paths of acquire and release (acquire_fast.lua, release_fast.lua) do exactly what
// the full scripts do: random sequences of calls run on two copies of one lock, one through
// dlock's scripts and one through the same scripts built without their fast paths, give the
// same replies and leave the same keys after every call (times and tokens aside).
func TestFastPathsMatchTheFullScripts(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	full := func(op string) *redis.Script {
		var src strings.Builder
		src.WriteString("#!lua\n")
		for _, f := range []string{"head.lua", "lib.lua", op} {
			b, err := os.ReadFile("internal/scripts/" + f)
			if err != nil {
				t.Fatal(err)
			}
			src.Write(b)
		}
		return redis.NewScript(src.String())
	}
	fast := [2]*redis.Script{scripts.Acquire, scripts.Release}
	slow := [2]*redis.Script{full("acquire.lua"), full("release.lua")}
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 1))
	for seq := range 200 {
		var a, b lockNames
		for i, k := range []*lockNames{&a, &b} {
			base := fmt.Sprintf("dlock:{%s-%d-%c}", redistest.Name(t), seq, "ab"[i])
			*k = lockNames{base, base + ":fence", base + ":log", base + ":queue", base + ":live", base + ":released"}
		}
		sm := fastPathSeq{rng: rng, mode: []string{"", "w", "r"}[rng.IntN(3)]}
		for step := range 30 {
			call := sm.next()
			var got [2]string
			for i, k := range []lockNames{a, b} {
				r := call.run(ctx, rdb, k, [2][2]*redis.Script{fast, slow}[i])
				got[i] = normalise(strings.ReplaceAll(r, k.lock, "K")) + "\n      " + keyState(ctx, rdb, k)
			}
			if got[0] != got[1] {
				t.Fatalf("seed %d, sequence %d, step %d: %s\nfast: %s\nfull: %s", seed, seq, step, call, got[0], got[1])
			}
		}
	}
}

// fastPathSeq makes the calls of one random sequence: two owners of one Client nonce each,
// hold ids that grow as a Client's do and are sometimes sent again (a late or retried command).
type fastPathSeq struct {
	rng  *rand.Rand
	mode string
	n    int
	ids  []string
}

type fastPathCall struct {
	desc string
	run  func(ctx context.Context, rdb *redis.Client, k lockNames, s [2]*redis.Script) string
}

func (c fastPathCall) String() string { return c.desc }

func (q *fastPathSeq) id() string {
	if len(q.ids) > 0 && q.rng.IntN(3) == 0 {
		return q.ids[q.rng.IntN(len(q.ids))]
	}
	q.n++
	id := "0123456789abcdef" + strconv.FormatInt(int64(q.n), 36)
	q.ids = append(q.ids, id)
	return id
}

func (q *fastPathSeq) next() fastPathCall {
	r := q.rng
	owner := []string{"A", "B"}[r.IntN(2)]
	mode := q.mode
	if r.IntN(10) == 0 {
		mode = []string{"", "w", "r"}[r.IntN(3)]
	}
	bit := func(p int) string { return map[bool]string{true: "1", false: "0"}[r.IntN(p) == 0] }
	id := q.id()
	undone := ""
	if r.IntN(8) == 0 && len(q.ids) > 0 {
		undone = q.ids[r.IntN(len(q.ids))]
	}
	switch n := r.IntN(21); {
	case n < 9:
		queue, reentrant := bit(2), bit(3)
		return fastPathCall{fmt.Sprintf("acquire %s %s mode %q queue %s reentrant %s undone %q", owner, id, mode, queue, reentrant, undone),
			func(ctx context.Context, rdb *redis.Client, k lockNames, s [2]*redis.Script) string {
				return reply(s[0].Run(ctx, rdb, []string{k.lock, k.fence, k.log, k.queue, k.live},
					owner, 30000, id, 60000, queue, 750, k.channel, 500, "PUBLISH", reentrant, 60000, 0, mode, 1, undone).Result())
			}}
	case n < 17:
		onlyIf, leaving := bit(6), bit(6)
		return fastPathCall{fmt.Sprintf("release %s %s mode %q onlyIfAcquired %s leaving %s undone %q", owner, id, mode, onlyIf, leaving, undone),
			func(ctx context.Context, rdb *redis.Client, k lockNames, s [2]*redis.Script) string {
				return reply(s[1].Run(ctx, rdb, []string{k.lock, k.log, k.fence, k.queue, k.live},
					owner, id, 60000, k.channel, onlyIf, 500, "PUBLISH", leaving, 0, mode, undone).Result())
			}}
	case n == 17:
		return fastPathCall{"the lock expires", func(ctx context.Context, rdb *redis.Client, k lockNames, _ [2]*redis.Script) string {
			return reply(rdb.Del(ctx, k.lock).Result())
		}}
	case n == 18:
		return fastPathCall{"the op log expires", func(ctx context.Context, rdb *redis.Client, k lockNames, _ [2]*redis.Script) string {
			return reply(rdb.Del(ctx, k.log).Result())
		}}
	case n == 19:
		return fastPathCall{"the queue expires", func(ctx context.Context, rdb *redis.Client, k lockNames, _ [2]*redis.Script) string {
			return reply(rdb.Del(ctx, k.queue, k.live).Result())
		}}
	default:
		return fastPathCall{"the lock key is overwritten by a string", func(ctx context.Context, rdb *redis.Client, k lockNames, _ [2]*redis.Script) string {
			return reply(rdb.Set(ctx, k.lock, "x", 0).Result())
		}}
	}
}

func reply(v any, err error) string {
	if err != nil {
		return "error " + err.Error()
	}
	return fmt.Sprint(v)
}

// bigNumber matches the numbers that differ between two runs of one call: tokens, server
// times and deadlines, TTLs.
var bigNumber = regexp.MustCompile(`\d{3,}(\.\d+)?`)

func normalise(s string) string { return bigNumber.ReplaceAllString(s, "N") }

// keyState describes a lock's keys: type, content (times and tokens normalised), whether
// each has a TTL. Not the fence, which expires within about a millisecond of the call.
func keyState(ctx context.Context, rdb *redis.Client, k lockNames) string {
	keys := []string{k.lock, k.log, k.queue, k.live}
	pipe := rdb.Pipeline()
	types, hashes, zsets, ttls := make([]*redis.StatusCmd, 4), make([]*redis.MapStringStringCmd, 4),
		make([]*redis.StringSliceCmd, 4), make([]*redis.DurationCmd, 4)
	for i, key := range keys {
		types[i], ttls[i] = pipe.Type(ctx, key), pipe.PTTL(ctx, key)
		hashes[i], zsets[i] = pipe.HGetAll(ctx, key), pipe.ZRange(ctx, key, 0, -1)
	}
	_, _ = pipe.Exec(ctx) // a wrong type's error is in its command, read below only for its type
	var out []string
	for i := range keys {
		typ := types[i].Val()
		var v string
		switch typ {
		case "hash":
			var kv []string
			for f, x := range hashes[i].Val() {
				kv = append(kv, f+"="+x)
			}
			slices.Sort(kv)
			v = strings.Join(kv, " ")
		case "zset":
			v = strings.Join(zsets[i].Val(), " ")
		case "string":
			v = rdb.Get(ctx, keys[i]).Val()
		}
		out = append(out, fmt.Sprintf("%s[%v]{%s}", typ, ttls[i].Val() > 0, v))
	}
	return normalise(strings.Join(out, " "))
}
