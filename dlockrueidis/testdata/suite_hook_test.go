// This file is not part of any package here: `make test-rueidis` lays it over the root
// package's tests (go test -overlay), so dlock's whole suite runs with its scripts on rueidis.

package dlock_test

import (
	"fmt"
	"reflect"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// defaultDialer is the code of go-redis's own dialer (Options fills Dialer in when nil); a
// client with another is a test's fault injector, whose rueidis client must dial through it.
var defaultDialer = func() uintptr {
	c := redis.NewClient(&redis.Options{})
	defer c.Close()
	return reflect.ValueOf(c.Options().Dialer).Pointer()
}()

// rueidisClients caches one rueidis client per server and credentials for the whole run (the
// suite's go-redis clients come and go per test; their servers are few).
var rueidisClients sync.Map // string -> rueidis.Client

// made holds every rueidis client the hook made, closed after the tests (redistest.AtEnd), so
// that the leak check after them sees only goroutines nothing would ever stop.
var made struct {
	sync.Mutex
	clients []rueidis.Client
}

func init() {
	redistest.AtEnd(func() {
		made.Lock()
		defer made.Unlock()
		for _, rc := range made.clients {
			rc.Close()
		}
	})
	dlock.SetTestScriptRunner(func(rdb redis.UniversalClient) dlock.ScriptRunner {
		key := ""
		switch r := rdb.(type) {
		case *redis.Client:
			o := r.Options()
			if reflect.ValueOf(o.Dialer).Pointer() != defaultDialer {
				break // a test's own dialer (a fault injector): not shared
			}
			key = fmt.Sprintf("c %q %q %q %q %d", o.Network, o.Addr, o.Username, o.Password, o.DB)
		case *redis.ClusterClient:
			o := r.Options()
			key = fmt.Sprintf("cc %q %q %q", o.Addrs, o.Username, o.Password)
		}
		if key != "" {
			if rc, ok := rueidisClients.Load(key); ok {
				return dlockrueidis.RunnerFor(rdb, rc.(rueidis.Client))
			}
		}
		var rc rueidis.Client
		var err error
		if cc, ok := rdb.(*redis.ClusterClient); ok {
			// Not through a test's dialer: the dials it counts are go-redis's and dlock's
			// (rueidis redials a dead node on its own schedule).
			o := cc.Options()
			rc, err = rueidis.NewClient(rueidis.ClientOption{InitAddress: o.Addrs, Username: o.Username,
				Password: o.Password, DisableCache: true, DisableRetry: true, AlwaysPipelining: true})
		} else {
			rc, err = dlockrueidis.ClientFor(rdb)
		}
		if err != nil {
			return nil // a Sentinel client, or a server down from the start: go-redis runs it
		}
		made.Lock()
		made.clients = append(made.clients, rc)
		made.Unlock()
		if key != "" {
			if prev, loaded := rueidisClients.LoadOrStore(key, rc); loaded {
				rc.Close()
				rc = prev.(rueidis.Client)
			}
		}
		return dlockrueidis.RunnerFor(rdb, rc)
	})
}
