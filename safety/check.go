package main

import (
	"bufio"
	"encoding/json"
	"os"
	"sort"
)

// verdict is what the checker finds in one scenario's histories.
type verdict struct {
	Ops           int `json:"ops"`
	Acquisitions  int `json:"acquisitions"`
	Unknown       int `json:"unknown"`        // operations whose outcome is unknown (lost replies)
	Overlaps      int `json:"overlaps"`       // two clients' validity windows overlapping
	StaleAccepted int `json:"stale_accepted"` // a write accepted after a higher token's write
	Increments    int `json:"increments"`     // successful read-modify-writes (lockset)
	LostUpdates   int `json:"lost_updates"`   // increments minus the final counter (lockset)
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

type window struct {
	client     int
	start, end int64
}

// check merges the clients' histories (CLOCK_MONOTONIC is shared by all processes) and counts
// what breaks the lock's guarantees. finalCounter is the lockset counter at the end (-1 when
// the workload is not lockset).
func check(ops []op, finalCounter int64) verdict {
	var v verdict
	v.Ops = len(ops)
	var windows []window
	type write struct {
		call, ret int64
		token     uint64
	}
	var writes []write
	// Each client records an acquire followed by its release.
	pending := map[int]op{}
	for _, o := range ops {
		if o.Result == "unknown" {
			v.Unknown++
		}
		switch o.Kind {
		case "acquire":
			if o.Result == "ok" {
				v.Acquisitions++
				pending[o.Client] = o
			}
		case "release":
			if a, ok := pending[o.Client]; ok {
				end := a.Until // the safe deadline the client computed
				if o.Call < end {
					end = o.Call // released earlier
				}
				windows = append(windows, window{o.Client, a.Return, end})
				delete(pending, o.Client)
			}
		case "write":
			if o.Result == "ok" {
				writes = append(writes, write{o.Call, o.Return, o.Token})
			}
		case "incr":
			if o.Result == "ok" {
				v.Increments++
			}
		}
	}
	sort.Slice(windows, func(i, j int) bool { return windows[i].start < windows[j].start })
	for i, w := range windows {
		for j := i - 1; j >= 0 && j >= i-64; j-- {
			if p := windows[j]; p.client != w.client && p.end > w.start {
				v.Overlaps++
				break
			}
		}
	}
	// A fenced resource must never accept a write after it accepted one with a higher token.
	sort.Slice(writes, func(i, j int) bool { return writes[i].call < writes[j].call })
	byRet := append([]write(nil), writes...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].ret < byRet[j].ret })
	var maxTok uint64
	k := 0
	for _, w := range writes {
		for k < len(byRet) && byRet[k].ret < w.call {
			maxTok = max(maxTok, byRet[k].token)
			k++
		}
		if w.token < maxTok {
			v.StaleAccepted++
		}
	}
	if finalCounter >= 0 {
		v.LostUpdates = v.Increments - int(finalCounter)
	}
	return v
}
