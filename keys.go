package dlock

import (
	"strings"

	"github.com/redis/go-redis/v9"
)

// layoutVersion is the key layout dlock writes (LAYOUT in internal/scripts/head.lua, "#v" in
// every lock hash). Scripts refuse a lock of another layout, so two dlock versions never both
// hold a lock during an upgrade.
const layoutVersion = "2"

// keys holds the Redis names of one lock. All of them carry the hash tag {name}, so every
// script touches a single Redis Cluster slot. A lock that is free and unwaited for leaves none
// of them behind for long: the lock hash goes with the last hold, the fence key opLogTTL after
// the server's clock has passed its value, the op log and queue keys after opLogTTL and
// queueTTL without use.
type keys struct {
	lock    string // hash {owner: holdCount, "#"+holdId: 1, "#t": token, "#v": layout} with the lease TTL
	fence   string // highest token reserved, at least Redis' clock in µs; expires opLogTTL after the clock passes it
	opLog   string // last release id and pending grant per owner, so retried calls are not applied twice
	queue   string // sorted set of waiting owners by arrival: first come first served
	live    string // hash {waiting owner: liveness deadline}, so dead waiters are skipped
	channel string // pub/sub channel: "g <owner>" a grant to owner, "w <owner>" freed for owner, first in line
}

// Suffixes of a lock's keys after the lock key (see lockKeys).
const (
	fenceSuffix = ":fence"
	logSuffix   = ":log"
	queueSuffix = ":queue"
	liveSuffix  = ":live"
)

var lockKeySuffixes = []string{fenceSuffix, logSuffix, queueSuffix, liveSuffix}

// lockKey is the key of the lock hash; the lock's other keys extend it.
func lockKey(prefix, name string) string { return prefix + "{" + name + "}" }

func lockKeys(prefix, name string) keys {
	base := lockKey(prefix, name)
	return keys{
		lock:    base,
		fence:   base + fenceSuffix,
		opLog:   base + logSuffix,
		queue:   base + queueSuffix,
		live:    base + liveSuffix,
		channel: base + ":released",
	}
}

// keySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash tag (what lies
// between the first "{" and the next "}", when not empty) or else of the whole key, modulo
// 16384, as the Cluster specification defines it.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// oneSlot reports whether one script may touch the keys of every lock of ks: always on a
// single Redis (standalone or Sentinel), on a Cluster when their lock keys share a slot, and
// never through other clients (a Ring shards keys across servers).
func (c *Client) oneSlot(ks []keys) bool {
	switch c.rdb.(type) {
	case *redis.Client:
		return true
	case *redis.ClusterClient:
		for _, k := range ks[1:] {
			if keySlot(k.lock) != keySlot(ks[0].lock) {
				return false
			}
		}
		return true
	}
	return false
}
