// Package scripts holds dlock's Lua scripts, one per operation. Each file opens with its
// KEYS/ARGV contract; the Go side only passes arguments and decodes replies. lib.lua holds
// what the lock scripts share (layout, token blocks, FIFO hand-off) and is prepended to them.
package scripts

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lib.lua
	libSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed multi_acquire.lua
	multiAcquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed fence_floor.lua
	fenceFloorSrc string
	//go:embed fenced_set.lua
	fencedSetSrc string
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

// lockScript builds a lock script: the shebang, the shared library, the operation.
func lockScript(src string) *redis.Script { return redis.NewScript(shebang + libSrc + src) }

// Scripts run with EVALSHA and fall back to EVAL when the server has not cached them yet.
var (
	Acquire      = lockScript(acquireSrc)
	MultiAcquire = lockScript(multiAcquireSrc)
	Release      = lockScript(releaseSrc)
	Extend       = lockScript(extendSrc)
	ForceRelease = lockScript(forceReleaseSrc)
	LatchSet     = lockScript(latchSetSrc)
	LatchDown    = lockScript(latchDownSrc)
	// FenceFloor needs nothing of the library, only the shebang's checks.
	FenceFloor = redis.NewScript(shebang + fenceFloorSrc)
	// FencedSet writes to a resource that may live on any Redis, so it has no shebang.
	FencedSet = redis.NewScript(fencedSetSrc)
)
