package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// percentile returns the nearest-rank p-quantile (0 < p ≤ 1) of sorted values.
func percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// jain returns Jain's fairness index (Σx)² / (n·Σx²): 1 when every goroutine got the same
// number of acquisitions, 1/n when one got them all.
func jain(counts []int64) float64 {
	var s, s2 float64
	for _, c := range counts {
		s += float64(c)
		s2 += float64(c) * float64(c)
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(counts)) * s2)
}

// handoffLatencies returns, for consecutive acquisitions (by acquisition time) made by
// different processes, next.acquired − prev.unlockCalled, in ns.
func handoffLatencies(res []*workerResult) []int64 {
	type rec struct {
		acq, unl int64
		proc     int
	}
	var all []rec
	for _, r := range res {
		for i := range r.Acquired {
			all = append(all, rec{r.Acquired[i], r.Unlocking[i], r.Proc})
		}
	}
	slices.SortFunc(all, func(a, b rec) int { return compareInt64(a.acq, b.acq) })
	var lat []int64
	for i := 1; i < len(all); i++ {
		if all[i].proc != all[i-1].proc {
			lat = append(lat, all[i].acq-all[i-1].unl)
		}
	}
	slices.Sort(lat)
	return lat
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// --- Redis INFO

type cmdStat struct{ calls, usec int64 }

// serverStats is one INFO commandstats + cpu snapshot.
type serverStats struct {
	cmds  map[string]cmdStat // by command name ("get", "client|list", ...)
	cpuUs float64            // used_cpu_sys + used_cpu_user, µs
}

func readServerStats(ctx context.Context, rdb *redis.Client) (serverStats, error) {
	s := serverStats{cmds: make(map[string]cmdStat)}
	txt, err := rdb.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(txt, "\n") {
		line = strings.TrimSpace(line)
		if name, rest, ok := strings.Cut(line, ":"); ok {
			switch {
			case strings.HasPrefix(name, "cmdstat_"):
				var c cmdStat
				for _, kv := range strings.Split(rest, ",") {
					k, v, _ := strings.Cut(kv, "=")
					switch k {
					case "calls":
						c.calls, _ = strconv.ParseInt(v, 10, 64)
					case "usec":
						c.usec, _ = strconv.ParseInt(v, 10, 64)
					}
				}
				s.cmds[strings.TrimPrefix(name, "cmdstat_")] = c
			case name == "used_cpu_sys" || name == "used_cpu_user":
				f, _ := strconv.ParseFloat(rest, 64)
				s.cpuUs += f * 1e6
			}
		}
	}
	return s, nil
}

// serverCost is the Redis work of a run.
type serverCost struct {
	calls int64   // commands executed (Redis counts commands run inside scripts too)
	usec  float64 // µs Redis spent in them (commandstats)
	cpuUs float64 // Redis process CPU time (INFO cpu), critical section and networking included
}

// costBetween computes the run's Redis work from two snapshots, leaving out the commands
// that are not the lock library's: exclude[name] calls of each command (the driver's own
// INFO, the critical section's GET and SET), with their µs taken pro rata.
func costBetween(before, after serverStats, exclude map[string]int64) serverCost {
	var c serverCost
	for name, a := range after.cmds {
		b := before.cmds[name]
		calls, usec := a.calls-b.calls, float64(a.usec-b.usec)
		if x := min(exclude[name], calls); x > 0 {
			usec -= usec * float64(x) / float64(calls)
			calls -= x
		}
		c.calls += calls
		c.usec += usec
	}
	c.cpuUs = after.cpuUs - before.cpuUs
	return c
}

// --- process status

// procStatusKB returns a field of /proc/self/status in kB (VmRSS, VmHWM), or -1.
func procStatusKB(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			fs := strings.Fields(rest)
			if len(fs) > 0 {
				v, _ := strconv.ParseInt(fs[0], 10, 64)
				return v
			}
		}
	}
	return -1
}

// --- this process's Redis connections

type connCount struct{ total, notify, pubsub, waiting int }

// ownRedisConns counts this process's connections in CLIENT LIST. A connection is this
// process's when its client address is one of the local TCP ports of this process's sockets
// (/proc/self/fd → socket inodes → /proc/self/net/tcp{,6}). Waiting connections are those
// named dlock-notify or in pub/sub mode.
func ownRedisConns(ctx context.Context, rdb *redis.Client) (connCount, error) {
	var cc connCount
	ports, err := ownTCPPorts()
	if err != nil {
		return cc, err
	}
	list, err := rdb.ClientList(ctx).Result()
	if err != nil {
		return cc, err
	}
	for _, line := range strings.Split(list, "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		addr := f["addr"]
		i := strings.LastIndexByte(addr, ':')
		if i < 0 {
			continue
		}
		port, err := strconv.Atoi(addr[i+1:])
		if err != nil || !ports[port] {
			continue
		}
		cc.total++
		notify := f["name"] == "dlock-notify"
		ps := strings.Contains(f["flags"], "P") || nonZero(f["sub"]) || nonZero(f["psub"]) || nonZero(f["ssub"])
		if notify {
			cc.notify++
		}
		if ps {
			cc.pubsub++
		}
		if notify || ps {
			cc.waiting++
		}
	}
	if cc.total == 0 {
		return cc, fmt.Errorf("no connection of this process found in CLIENT LIST (unix socket?)")
	}
	return cc, nil
}

func nonZero(s string) bool { return s != "" && s != "0" }

func ownTCPPorts() (map[int]bool, error) {
	fds, err := filepath.Glob("/proc/self/fd/*")
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		t, err := os.Readlink(fd)
		if err == nil && strings.HasPrefix(t, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(t, "socket:["), "]")] = true
		}
	}
	ports := map[int]bool{}
	for _, p := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			_, hexPort, ok := strings.Cut(fs[1], ":")
			if !ok {
				continue
			}
			if v, err := strconv.ParseInt(hexPort, 16, 32); err == nil {
				ports[int(v)] = true
			}
		}
	}
	return ports, nil
}
