package dlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The wait's reply is read by its kind: WAIT's count of replicas, WAITAOF's [local, replicas];
// a write is short of its setting when the count, or the master's own fsync it asked for,
// falls short, or the wait failed.
func TestReplicaAckReadsWaitAndWaitAOF(t *testing.T) {
	reply := func(v any, err error) *redis.Cmd {
		c := redis.NewCmd(context.Background(), "x")
		if err != nil {
			c.SetErr(err)
		} else {
			c.SetVal(v)
		}
		return c
	}
	wait := replicaAck{n: 2, timeout: 1}
	aofLocal := replicaAck{n: 1, timeout: 1, aof: true, local: true}
	aofOnly := replicaAck{n: 0, timeout: 1, aof: true, local: true}
	cases := []struct {
		what  string
		a     replicaAck
		reply *redis.Cmd
		short bool
	}{
		{"WAIT 2, two acknowledged", wait, reply(int64(2), nil), false},
		{"WAIT 2, one acknowledged", wait, reply(int64(1), nil), true},
		{"WAITAOF 1 1, both", aofLocal, reply([]any{int64(1), int64(1)}, nil), false},
		{"WAITAOF 1 1, replica only", aofLocal, reply([]any{int64(0), int64(1)}, nil), true},
		{"WAITAOF 1 1, master only", aofLocal, reply([]any{int64(1), int64(0)}, nil), true},
		{"WAITAOF 1 0, master", aofOnly, reply([]any{int64(1), int64(0)}, nil), false},
		{"WAITAOF 1 0, not even the master", aofOnly, reply([]any{int64(0), int64(3)}, nil), true},
		{"WAITAOF, malformed", aofLocal, reply([]any{int64(1)}, nil), true},
		{"WAIT failed", wait, reply(nil, errors.New("i/o timeout")), true},
	}
	for _, c := range cases {
		if got := c.a.short(c.a.read(c.reply)); got != c.short {
			t.Errorf("%s: short = %v, want %v", c.what, got, c.short)
		}
	}
	r := aofLocal.read(reply(nil, errors.New("ERR unknown command 'WAITAOF', with args beginning with: ")))
	if !errors.Is(r.err, ErrInvalid) || !errors.Is(r.err, ErrIncompatible) {
		t.Errorf("WAITAOF unknown: %v; want ErrInvalid and ErrIncompatible", r.err)
	}
}

// Holds with different acknowledgement settings never share a renewal batch (its one wait is
// sent and read under one setting), while holds with the same setting on one node do.
func TestRenewalBatchesKeepAckSettingsApart(t *testing.T) {
	wait := replicaAck{n: 1, timeout: time.Second}
	aof := replicaAck{n: 1, timeout: time.Second, aof: true}
	h := func(a replicaAck) *hold { return &hold{cfg: config{ack: a}} }
	due := []*hold{h(replicaAck{}), h(wait), h(aof), h(wait), h(replicaAck{}), h(aof)}
	batches := byNode(due)
	if len(batches) != 3 {
		t.Fatalf("%d batches, want 3 (plain, WAIT, WAITAOF)", len(batches))
	}
	for _, b := range batches {
		for _, x := range b[1:] {
			if x.cfg.ack != b[0].cfg.ack {
				t.Fatalf("a batch mixes %+v and %+v", b[0].cfg.ack, x.cfg.ack)
			}
		}
	}
}
