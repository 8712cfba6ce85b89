package dlock

// keys holds the Redis names of one lock. All of them carry the hash tag {name}, so every
// script touches a single Redis Cluster slot.
type keys struct {
	lock    string // hash {owner: holdCount} with the lease TTL
	fence   string // fencing counter, +64 per fresh hold and at least Redis' clock in µs; never expires
	opLog   string // last acquire/release id per owner, so retried calls are not applied twice
	queue   string // sorted set of waiting owners by arrival: first come first served
	live    string // hash {waiting owner: liveness deadline}, so dead waiters are skipped
	channel string // pub/sub channel for grants ("g <owner>") and releases ("r")
}

// lockKey is the key of the lock hash; the lock's other keys extend it.
func lockKey(prefix, name string) string { return prefix + "{" + name + "}" }

func lockKeys(prefix, name string) keys {
	base := lockKey(prefix, name)
	return keys{
		lock:    base,
		fence:   base + ":fence",
		opLog:   base + ":log",
		queue:   base + ":queue",
		live:    base + ":live",
		channel: base + ":released",
	}
}
