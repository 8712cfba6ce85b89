// Command dlock runs commands under Redis distributed locks and replays the scenarios that
// show why they are needed. It is a thin shell over the github.com/dlock-go/dlock library.
package main

import (
	"context"
	"os"

	"github.com/redis/go-redis/v9"
)

// quiet drops go-redis's own log lines (a failed dial during an outage, once per retry):
// dlock reports what failed as one "dlock: error:" line with a hint instead.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func main() {
	redis.SetLogger(quiet{})
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
