package redisserver

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Ports are picked below the kernel's ephemeral range, so a client connection's local port
// never takes the port of a killed server before its Restart, and each port handed out stays
// reserved in this process until the server's Stop. Another process can still take one
// between the check and redis-server's bind: launch then retries with a new port.
var (
	portsMu  sync.Mutex
	reserved = map[int]bool{}
)

// reservePort returns a free loopback port; for a cluster node (bus), one whose bus port
// (+10000) is free too. Both stay reserved until releasePorts.
func reservePort(bus bool) (int, error) {
	lo, hi := 10000, ephemeralLow()-1
	if bus {
		hi -= 10000
	}
	if hi-lo < 1000 { // an unusual ephemeral range: take our chances above it
		lo, hi = 20000, 50000
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for try := 0; try < 200; try++ {
		port := lo + rand.IntN(hi-lo+1)
		if reserved[port] || !portFree(port) {
			continue
		}
		if bus && (reserved[port+10000] || !portFree(port+10000)) {
			continue
		}
		reserved[port] = true
		if bus {
			reserved[port+10000] = true
		}
		return port, nil
	}
	return 0, fmt.Errorf("redisserver: no free loopback port in %d-%d", lo, hi)
}

// releasePorts makes ports available to reservePort again.
func releasePorts(ports []int) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for _, p := range ports {
		delete(reserved, p)
	}
}

// portFree reports whether a listener can bind 127.0.0.1:port now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 when unknown).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
