package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// clientSpec tells a client process what to do; the driver passes it as JSON.
type clientSpec struct {
	ID        int           `json:"id"`
	LockURL   string        `json:"lock_url"`
	ResURL    string        `json:"res_url"`
	Workload  string        `json:"workload"` // "fenced" or "lockset"
	Weak      bool          `json:"weak"`     // the positive control: SET NX + plain DEL, no fencing
	TTL       time.Duration `json:"ttl"`
	Work      time.Duration `json:"work"` // time inside the critical section
	Until     int64         `json:"until"`
	Name      string        `json:"name"`
	HistPath  string        `json:"hist"`
	Drift     float64       `json:"drift"`
	OpTimeout time.Duration `json:"op_timeout"`
}

const drift = 0.01

// writeMargin is how much of its validity window a holder wants left to start a write.
const writeMargin = 50 * time.Millisecond

// runClient loops acquire → work → release until spec.Until, recording every operation.
func runClient(spec clientSpec) error {
	f, err := os.Create(spec.HistPath)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	defer w.Flush()
	enc := json.NewEncoder(w)
	rec := func(o op) { o.Client = spec.ID; _ = enc.Encode(o) }

	lockOpt, err := redis.ParseURL(spec.LockURL)
	if err != nil {
		return err
	}
	lockOpt.MaxRetries = -1 // a retry would hide a lost reply; dlock's scripts are idempotent anyway
	resOpt, err := redis.ParseURL(spec.ResURL)
	if err != nil {
		return err
	}
	redis.SetLogger(quietLogger{}) // dial failures while Redis is down are expected here
	rdb, res := redis.NewClient(lockOpt), redis.NewClient(resOpt)
	defer rdb.Close()
	defer res.Close()
	c := dlock.New(rdb, dlock.WithTTL(spec.TTL), dlock.WithFixedLease(), dlock.WithDrift(spec.Drift), dlock.WithoutCohort())
	defer c.Close(context.Background())
	m := c.Mutex(spec.Name)
	weakKey := "weak:{" + spec.Name + "}"
	var token uint64

	for mono() < spec.Until {
		ctx, cancel := context.WithTimeout(context.Background(), spec.OpTimeout)
		call := mono()
		var l *dlock.Lease
		var done <-chan struct{}
		if spec.Weak {
			ok, err := rdb.SetNX(ctx, weakKey, spec.ID, spec.TTL).Result()
			if err != nil || !ok {
				cancel()
				rec(op{Kind: "acquire", Call: call, Return: mono(), Result: outcomeOf(err, "fail")})
				time.Sleep(time.Millisecond)
				if err != nil {
					time.Sleep(10 * time.Millisecond) // Redis down: do not spin
				}
				continue
			}
			// Tokens it hands out but nothing checks: what "fencing disabled" means.
			t, err := rdb.Incr(ctx, weakKey+":token").Uint64()
			if err != nil {
				cancel()
				continue
			}
			token = t
		} else {
			var err error
			l, err = m.Lock(ctx)
			if err != nil {
				cancel()
				rec(op{Kind: "acquire", Call: call, Return: mono(), Result: outcomeOf(err, "fail")})
				time.Sleep(10 * time.Millisecond) // Redis down: do not spin on "connection refused"
				continue
			}
			token, done = l.Token(), l.Done()
		}
		ret := mono()
		until := call + int64(float64(spec.TTL)*(1-spec.Drift))
		// Tell the nemesis who is inside the critical section, so pauses hit holders.
		_ = res.Set(ctx, "holder", spec.ID, 0).Err()
		acq := op{Kind: "acquire", Call: call, Return: ret, Token: token, Result: "ok", Until: until}

		// The critical section. A correct holder stops as soon as its lease ends (Done) and
		// does not start a write it cannot finish well inside its validity window.
		ended := func() bool {
			if done == nil {
				return false
			}
			select {
			case <-done:
				return true
			default:
				return mono()+int64(writeMargin) > until
			}
		}
		switch spec.Workload {
		case "fenced":
			time.Sleep(spec.Work)
			if !ended() {
				wc := mono()
				var err error
				if spec.Weak {
					err = res.HSet(ctx, "reg", "v", spec.ID, "t", 0).Err()
				} else {
					err = dlock.FencedSet(ctx, res, "reg", spec.ID, token)
				}
				rec(op{Kind: "write", Call: wc, Return: mono(), Token: token, Result: outcomeOf(err, "fail")})
			}
		case "lockset":
			rc := mono()
			v, err := res.Get(ctx, "counter").Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				rec(op{Kind: "incr", Call: rc, Return: mono(), Token: token, Result: "fail"})
				break
			}
			time.Sleep(spec.Work)
			if !ended() {
				err = res.Set(ctx, "counter", v+1, 0).Err()
				rec(op{Kind: "incr", Call: rc, Return: mono(), Token: token, Result: outcomeOf(err, "fail"), Value: v})
			}
		}
		if done != nil && ended() {
			acq.Lost = mono()
		}
		rc := mono()
		var err error
		if spec.Weak {
			err = rdb.Del(ctx, weakKey).Err() // the unsafe unlock: deletes whoever holds it
		} else {
			err = l.Unlock(ctx)
		}
		cancel()
		rel := op{Kind: "release", Call: rc, Return: mono(), Token: token, Result: outcomeOf(err, "fail")}
		rec(acq)
		rec(rel)
	}
	return nil
}

// outcomeOf classifies an error: nil is ok; a reply from Redis or a refusal is fail; anything
// else (timeout, reset) is unknown, since the operation may have taken effect.
func outcomeOf(err error, refused string) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, dlock.ErrNotObtained), errors.Is(err, dlock.ErrNotHeld), errors.Is(err, dlock.ErrStaleToken):
		return refused
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return refused
	}
	return "unknown"
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...interface{}) {}
