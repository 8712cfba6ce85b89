package main

// The load driver: vegeta's Attacker, fed by a Targeter over a prepared list of clicks, as
// fast as a fixed number of workers can go.

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Load is the shape of the crowd.
type Load struct {
	Users   int // virtual users
	Clicks  int // "buy" clicks per user
	Workers int // requests in flight at once
	// Window is how many users' clicks are shuffled together. Users arrive in random order,
	// Window at a time, and their clicks are interleaved, so a user's clicks sit within
	// Window×Clicks requests of each other: with Workers at least that, they overlap in
	// flight, as when a user hammers the button.
	Window int
}

// clicks returns the user id of each click, in the order they are sent.
func (l Load) clicks(rng *rand.Rand) []int64 {
	users := rng.Perm(l.Users)
	out := make([]int64, 0, l.Users*l.Clicks)
	for start := 0; start < len(users); start += l.Window {
		var batch []int64
		for _, u := range users[start:min(start+l.Window, len(users))] {
			for range l.Clicks {
				batch = append(batch, int64(u+1))
			}
		}
		rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
		out = append(out, batch...)
	}
	return out
}

// Report is what vegeta measured of one attack.
type Report struct {
	Metrics  vegeta.Metrics
	ReqPerS  float64     // requests answered per second, whatever the status
	Statuses map[int]int // HTTP status → count; 0 is a transport error
}

// Attack sends every click as POST base/buy?user=ID and returns vegeta's metrics.
func Attack(base string, l Load, seed uint64) Report {
	ids := l.clicks(rand.New(rand.NewPCG(seed, 0)))
	var next atomic.Int64
	// A custom Targeter hands out the prepared clicks; ErrNoTargets ends the attack.
	targeter := func(t *vegeta.Target) error {
		i := next.Add(1) - 1
		if i >= int64(len(ids)) {
			return vegeta.ErrNoTargets
		}
		t.Method, t.URL = http.MethodPost, base+"/buy?user="+strconv.FormatInt(ids[i], 10)
		return nil
	}
	w := uint64(l.Workers)
	atk := vegeta.NewAttacker(vegeta.Workers(w), vegeta.MaxWorkers(w), vegeta.Timeout(30*time.Second))
	// A zero rate with MaxWorkers set is vegeta's "as fast as the workers go" mode.
	rate := vegeta.Rate{Freq: 0, Per: time.Second}
	rep := Report{Statuses: map[int]int{}}
	for res := range atk.Attack(targeter, rate, 0, "flashsale") {
		if res.Code == 0 && res.Error == vegeta.ErrNoTargets.Error() {
			continue // a worker that found the list empty: not a request
		}
		rep.Metrics.Add(res)
		rep.Statuses[int(res.Code)]++
	}
	rep.Metrics.Close()
	if d := rep.Metrics.Duration + rep.Metrics.Wait; d > 0 {
		rep.ReqPerS = float64(rep.Metrics.Requests) / d.Seconds()
	}
	return rep
}
