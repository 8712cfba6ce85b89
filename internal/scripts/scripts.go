// Package scripts holds dlock's Lua scripts, one per operation. Each file opens with its
// KEYS/ARGV contract; the Go side only passes arguments and decodes replies. lib.lua holds
// what the lock scripts share (layout, token blocks, FIFO hand-off) and is prepended to them.
package scripts

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed head.lua
	headSrc string
	//go:embed lib.lua
	libSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed acquire_fast.lua
	acquireFastSrc string
	//go:embed multi_acquire.lua
	multiAcquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed release_fast.lua
	releaseFastSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed fence_floor.lua
	fenceFloorSrc string
	//go:embed fenced_set.lua
	fencedSetSrc string
	//go:embed read_fields.lua
	readFieldsSrc string
	//go:embed force_release.lua
	forceReleaseSrc string
	//go:embed latch_set.lua
	latchSetSrc string
	//go:embed latch_down.lua
	latchDownSrc string
)

// shebang makes Redis check, before a lock script runs, that it may write (master, enough
// replicas, memory), so a refused script has changed nothing; servers before 7.0 refuse it.
const shebang = "#!lua\n"

// lockScript builds a lock script: the shebang, the shared head and library, the operation.
func lockScript(src string) *redis.Script { return sourced(shebang + headSrc + libSrc + src) }

// fastLockScript builds a lock script whose operation has a fast path: the path runs first,
// with only head.lua defined, and the library and the operation are one function it calls
// when it does not serve the call. Defining the library's functions costs server time on
// every call (Redis runs the whole script each time), which the common case then never pays.
func fastLockScript(fast, src string) *redis.Script {
	return sourced(shebang + headSrc + fast + "\nlocal function full()\n" + libSrc + src + "\nend\nreturn full()\n")
}

// sources maps each script to its full source (written only while the package's
// variables are initialised).
var sources = map[*redis.Script]string{}

func sourced(src string) *redis.Script {
	s := redis.NewScript(src)
	sources[s] = src
	return s
}

// Source returns the full Lua source of one of this package's scripts, as Redis runs it (for
// running them through another client library); "" for any other script.
func Source(s *redis.Script) string { return sources[s] }

// Scripts run with EVALSHA and fall back to EVAL when the server has not cached them yet.
var (
	Acquire      = fastLockScript(acquireFastSrc, acquireSrc)
	MultiAcquire = lockScript(multiAcquireSrc)
	Release      = fastLockScript(releaseFastSrc, releaseSrc)
	Extend       = lockScript(extendSrc)
	ForceRelease = lockScript(forceReleaseSrc)
	LatchSet     = lockScript(latchSetSrc)
	LatchDown    = lockScript(latchDownSrc)
	// FenceFloor needs nothing of the library, only the shebang's checks.
	FenceFloor = sourced(shebang + fenceFloorSrc)
	// ReadFields reads on the master only (the shebang's checks, nothing of the library), also
	// when the master is at maxmemory: it writes nothing.
	ReadFields = sourced("#!lua flags=allow-oom\n" + readFieldsSrc)
	// FencedSet writes to a resource that may live on any Redis, so it has no shebang.
	FencedSet = sourced(fencedSetSrc)
)
