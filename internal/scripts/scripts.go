// Package scripts holds dlock's Lua scripts, one per operation. Each file opens with its
// KEYS/ARGV contract; the Go side only passes arguments and decodes replies. grant.lua holds
// the FIFO hand-off shared by acquire and release and is prepended to both.
package scripts

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed grant.lua
	grantSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed fenced_set.lua
	fencedSetSrc string
	//go:embed force_release.lua
	forceReleaseSrc string
)

// Scripts run with EVALSHA and fall back to EVAL when the server has not cached them yet.
var (
	Acquire      = redis.NewScript(grantSrc + acquireSrc)
	Release      = redis.NewScript(grantSrc + releaseSrc)
	Extend       = redis.NewScript(extendSrc)
	FencedSet    = redis.NewScript(fencedSetSrc)
	ForceRelease = redis.NewScript(grantSrc + forceReleaseSrc)
)
