package main

import (
	"bufio"
	"encoding/json"
	"os"
	"sync"
)

// An op is one recorded operation of a client process, with call and return times on
// CLOCK_MONOTONIC.
type op struct {
	Client int `json:"c"` // the client process (1-based); 0 for the nemesis's ops
	// G is the goroutine within the client process (1-based) in the default-mode workload,
	// where several goroutines of one process take the same locks; 0 otherwise. A holder (see
	// holder) is one goroutine: with cohorting, the goroutines of a process share one owner
	// id in Redis, yet each of their leases is a holder of its own, with a token of its own.
	G    int    `json:"g,omitempty"`
	Lock int    `json:"l"` // which of the scenario's locks (and its resource)
	Kind string `json:"k"` // "acquire", "read", "write", "incr", "extend", "release", "reenter", "unreenter", "force",
	// and for latches "set", "down", "wait"
	Call   int64  `json:"call"`
	Return int64  `json:"ret"`
	Token  uint64 `json:"tok,omitempty"` // the lease's token; for a read, the token read
	// Result: "ok", "fail" (refused: not obtained, stale token, not held) or "unknown" (the
	// reply was lost: the operation may or may not have taken effect).
	Result string `json:"res"`
	// Until (acquire ops) is the end of the lease's validity window as the client last knew
	// it: the latest now + Lease.Remaining it read before acting under the lease.
	Until int64 `json:"until,omitempty"`
	// Lost (acquire ops) says the client saw the lease end (Done) before its release.
	Lost bool `json:"lost,omitempty"`
	// Acq (release and extend ops) is the call time of the acquire whose lease they act on.
	Acq int64 `json:"acq,omitempty"`
	// Value is what a read-modify-write read (incr ops).
	Value int64 `json:"v,omitempty"`
	// Owner (acquire ops) is Lease.Owner(): the id the lease's hold has in Redis, shared by
	// the local holders of a cohort.
	Owner string `json:"o,omitempty"`
	// Cohort (acquire ops) says the lease may have been handed over locally (cohorting): the
	// Redis hold behind it may be older than the acquire's call, so only Until bounds its
	// expiry from below, not call + TTL × (1 − drift).
	Cohort bool `json:"co,omitempty"`
	// DoneAt (acquire ops) is when the holder saw Done close (lost, or ended by its release).
	DoneAt int64 `json:"done,omitempty"`
	// False (acquire ops) says the lease ended by an answer from Redis (not by its safe
	// deadline) while its hold was still there: the client read the lock right after and
	// found the same owner and token block.
	False bool `json:"false,omitempty"`
	// Mode (acquire ops) is "r" for a read lease of a read-write lock (readers may overlap
	// readers), "m" for a member of a multi-lock lease (exclusive; once the lease is lost,
	// dlock gives its other members back, so their holds end at its DoneAt), "" for any other
	// exclusive lease (a Mutex's, a writer's).
	Mode string `json:"m,omitempty"`
	// Permits (acquire ops with Mode "s") is how many permits the lease took of a semaphore of
	// Of permits. For a latch's set op, Value is the count it set.
	Permits int `json:"p,omitempty"`
	Of      int `json:"of,omitempty"`
	// Note: for force ops, "kill-t" or "kill-P" when the nemesis had just killed the
	// notification connections of that kind; for reenter ops, a re-entry anomaly.
	Note string `json:"note,omitempty"`
}

// shared reports whether a lease's mode lets it overlap others of the same mode: readers of
// a read-write lock ("r") and a semaphore's holders ("s", up to its permits).
func shared(mode string) bool { return mode == "r" || mode == "s" }

// holder names who holds a lease in the model and the checks: one goroutine of one process.
func (o op) holder() int { return o.Client*1000 + o.G }

// A recorder appends a client's ops to its history file, one JSON object per line.
type recorder struct {
	mu  sync.Mutex // the goroutines of a default-mode client share it
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
	id  int
	// flush writes every op through at once: a client the nemesis SIGKILLs keeps what it
	// recorded up to then (a line is one write, so at worst the last op is lost whole).
	flush bool
}

func newRecorder(path string, id int) (*recorder, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(f)
	return &recorder{f: f, w: w, enc: json.NewEncoder(w), id: id}, nil
}

func (r *recorder) rec(o op) {
	o.Client = r.id
	r.mu.Lock()
	_ = r.enc.Encode(o)
	if r.flush {
		_ = r.w.Flush()
	}
	r.mu.Unlock()
}

func (r *recorder) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.w.Flush(); err != nil {
		return err
	}
	return r.f.Close()
}

func readHistory(path string) ([]op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []op
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var o op
		if err := json.Unmarshal(sc.Bytes(), &o); err == nil {
			ops = append(ops, o)
		}
	}
	return ops, sc.Err()
}
