package main

import (
	"bufio"
	"encoding/json"
	"os"
)

// An op is one recorded operation of a client process, with call and return times on
// CLOCK_MONOTONIC.
type op struct {
	Client int    `json:"c"`
	Lock   int    `json:"l"` // which of the scenario's locks (and its resource)
	Kind   string `json:"k"` // "acquire", "read", "write", "incr", "extend", "release"
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
}

// A recorder appends a client's ops to its history file, one JSON object per line.
type recorder struct {
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
	id  int
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
	_ = r.enc.Encode(o)
}

func (r *recorder) close() error {
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
