package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// connection is where the CLI's Redis is: one deployment, or the independent masters of a
// Redlock (--redis repeated), and the throwaway server behind it if it started one.
type connection struct {
	url     string
	rdb     redis.UniversalClient   // the deployment, or the first master
	masters []redis.UniversalClient // every --redis, in order (one for a single deployment)
	server  *redisserver.Server
}

const urlHint = "use redis://[user:pass@]host:port/db, rediss://... (TLS), unix:///path/redis.sock, " +
	"redis+cluster://host:port?addr=host2:port2 or redis+sentinel://host:26379?master_name=NAME"

// connect resolves --redis (repeated: a Redlock's masters) or REDIS_URL and checks that Redis
// answers PING. A Redlock goes on while a quorum of its masters answers, naming each one that
// does not in a warning (a typo shows there, not as a master silently missing); a master that
// refuses the client (password, ACL) is an error. With neither set and throwaway true, it
// starts a private redis-server in a temp dir (removed by close).
func connect(flagURLs []string, throwaway bool) (*connection, error) {
	urls := flagURLs
	if len(urls) == 0 && os.Getenv("REDIS_URL") != "" {
		urls = []string{os.Getenv("REDIS_URL")}
	}
	if len(urls) == 0 && throwaway {
		s, err := redisserver.Start(redisserver.Config{})
		if err != nil {
			return nil, hinted{err, "install redis-server (`apt-get install -y redis-server` on Debian) or point --redis / REDIS_URL at a running Redis"}
		}
		rdb := s.Client()
		return &connection{url: s.URL(), rdb: rdb, masters: []redis.UniversalClient{rdb}, server: s}, nil
	}
	if len(urls) == 0 {
		return nil, usageError{"no Redis given", "pass --redis URL or set REDIS_URL (" + urlHint + ")"}
	}
	if len(urls) == 2 {
		return nil, usageError{"two --redis URLs: a Redlock needs at least 3 independent masters", "give one --redis for one deployment, or 3 or more (5 is usual) for a Redlock"}
	}
	c := &connection{url: strings.Join(urls, " ")}
	for _, url := range urls {
		rdb, err := openURL(url)
		if err != nil {
			c.close()
			return nil, usageError{fmt.Sprintf("bad Redis URL %q: %s", shownURL(url), urlErr(url, err)), urlHint}
		}
		c.masters = append(c.masters, rdb)
	}
	c.rdb = c.masters[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	errs := make([]error, len(c.masters))
	var wg sync.WaitGroup
	for i, rdb := range c.masters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rdb.Ping(ctx).Err(); err != nil {
				errs[i] = pingError(urls[i], err)
			}
		}()
	}
	wg.Wait()
	// A refusal (a wrong password, an ACL) is a mistake to fix, on any master. A Redlock
	// goes on while a quorum of its masters answers, as it was made to: the others are named.
	var down []error
	for _, err := range errs {
		if err != nil && !errors.Is(err, dlock.ErrUnavailable) {
			c.close()
			return nil, err
		}
		if err != nil {
			down = append(down, err)
		}
	}
	if len(down) > 0 && (len(c.masters) == 1 || len(c.masters)-len(down) < len(c.masters)/2+1) {
		c.close()
		return nil, down[0]
	}
	for _, err := range down {
		fmt.Fprintf(warnings, "dlock: warning: %v; going on with %d of %d masters\n", err, len(c.masters)-len(down), len(c.masters))
	}
	return c, nil
}

// warnings is where dlock writes what it goes on despite (run sets it to its stderr).
var warnings io.Writer = os.Stderr

// pingError says why Redis at url did not answer PING. No answer, or one saying it cannot
// serve now (LOADING, BUSY, ...), is Redis unavailable (exit 69, worth retrying); a refusal
// (a wrong password, a user without the permission) or any other error answer (a database
// index out of range, PING renamed) is a mistake to fix, which retrying never mends.
func pingError(url string, err error) error {
	at := shownURL(url)
	var reply redis.Error
	switch {
	case !errors.As(err, &reply) || hasPrefix(reply.Error(), notNow):
		return hinted{unreachable{fmt.Errorf("cannot reach Redis at %s: %w", at, err)}, "check that Redis is running and the URL is right"}
	case hasPrefix(reply.Error(), refusals):
		return hinted{fmt.Errorf("Redis at %s refused PING: %w", at, err), "check the user and password in the URL, and the user's ACL"}
	}
	return hinted{fmt.Errorf("Redis at %s answered PING with an error: %w", at, err), "check the URL's options (the database number) and the server's settings"}
}

// Error replies that refuse the client (authentication, ACL), and those that say the server
// cannot serve now (those the library counts as unavailable, redis_errors.go, and a full
// client table).
var (
	refusals = []string{"NOAUTH", "WRONGPASS", "NOPERM", "ERR AUTH", "ERR invalid password", "ERR Client sent AUTH"}
	notNow   = []string{"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS", "MISCONF", "ERR max number of clients"}
)

// hasPrefix reports whether s starts with one of prefixes.
func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// shownURL is the Redis URL u as error lines show it (they reach cron mail, journald, CI
// logs): its password and password options masked when it parses plainly; otherwise only its scheme,
// since what does not parse cannot be told apart from a password.
func shownURL(u string) string {
	if u == "" {
		return ""
	}
	p, err := url.Parse(u)
	if err != nil || p.Scheme == "" || p.Opaque != "" || misplacedAt(u) {
		scheme, _, ok := strings.Cut(u, "://")
		if !ok || strings.ContainsAny(scheme, "@:/") {
			return "(a URL that does not parse, not shown)"
		}
		return scheme + "://... (not shown: it may hold a password)"
	}
	q := p.Query()
	for k := range q {
		if strings.Contains(strings.ToLower(k), "password") {
			q.Set(k, "xxxxx")
		}
	}
	p.RawQuery = q.Encode()
	if p.User != nil {
		if _, has := p.User.Password(); !has {
			p.User = url.User("xxxxx") // a lone part may be the password
		}
	}
	return p.Redacted()
}

// misplacedAt says whether u parses with a fragment, or with an @ in its path (but a unix
// socket's, which may have one) or a query key:
// what a password holding an unencoded #, ? or / becomes ("redis://:99#pw@host" is host ":99"
// and fragment "pw@host"). Such a URL is refused, and error lines do not show it.
func misplacedAt(u string) bool {
	p, err := url.Parse(u)
	if err != nil {
		return false
	}
	// A unix socket's path may hold an @, but not after a host: a unix URL has none, and
	// "unix://user:12/pw@/path" is a password holding a / read as host and path.
	if p.Fragment != "" || strings.HasSuffix(u, "#") || ((p.Scheme != "unix" || p.Host != "") && strings.Contains(p.EscapedPath(), "@")) {
		return true
	}
	for k := range p.Query() {
		if strings.Contains(k, "@") {
			return true
		}
	}
	return false
}

// checkPorts refuses a port outside 1-65535 in u's host or its addr options (a cluster's or
// sentinel's other nodes), which would otherwise be reported as Redis being unreachable.
func checkPorts(u string) error {
	p, err := url.Parse(u)
	if err != nil {
		return nil // the URL's parser says what is wrong
	}
	for _, hp := range append([]string{p.Host}, p.Query()["addr"]...) {
		_, port, ok := strings.Cut(hp[strings.LastIndex(hp, "]")+1:], ":")
		if !ok || port == "" {
			continue
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return urlProblem(fmt.Sprintf("port %q is not a number from 1 to 65535", port))
		}
	}
	return nil
}

// A urlProblem is openURL's own word on a bad URL: it quotes no part of the URL that may be a
// password, so error lines show it whole.
type urlProblem string

func (p urlProblem) Error() string { return string(p) }

// errMisplacedAt is openURL's error for a URL misplacedAt.
var errMisplacedAt = urlProblem("it has a # or an @ after the host: a password holding #, ? or / must be percent-encoded (%23, %3F, %2F)")

// urlErr is err's text for a line about the Redis URL u: not shown when u may hold a password,
// as parse errors quote parts of the URL.
func urlErr(u string, err error) string {
	var own urlProblem
	if errors.As(err, &own) {
		return err.Error()
	}
	if strings.Contains(u, "@") || strings.Contains(strings.ToLower(u), "password") {
		return "(the parser's message is not shown: the URL may hold a password)"
	}
	return err.Error()
}

// client makes the dlock Client over the connection: a Redlock's when --redis was repeated.
func (c *connection) client(opts ...dlock.Option) *dlock.Client {
	if len(c.masters) > 1 {
		return dlock.NewRedlock(c.masters, opts...)
	}
	return dlock.New(c.rdb, opts...)
}

// openURL makes a client for a redis://, rediss://, unix://, redis+cluster:// or
// redis+sentinel:// URL.
func openURL(url string) (redis.UniversalClient, error) {
	if url == "" {
		return nil, urlProblem("it is empty")
	}
	if misplacedAt(url) {
		return nil, errMisplacedAt
	}
	if err := checkPorts(url); err != nil {
		return nil, err
	}
	switch {
	case strings.HasPrefix(url, "redis+cluster://"), strings.HasPrefix(url, "rediss+cluster://"):
		opt, err := redis.ParseClusterURL(strings.Replace(url, "+cluster", "", 1))
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(opt), nil
	case strings.HasPrefix(url, "redis+sentinel://"), strings.HasPrefix(url, "rediss+sentinel://"):
		opt, err := redis.ParseFailoverURL(strings.Replace(url, "+sentinel", "", 1))
		if err != nil {
			return nil, err
		}
		if opt.MasterName == "" {
			return nil, urlProblem("a redis+sentinel URL needs ?master_name=NAME, the name the sentinels monitor")
		}
		return redis.NewFailoverClient(opt), nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opt), nil
}

func (c *connection) close() {
	for _, rdb := range c.masters {
		_ = rdb.Close()
	}
	if c.server != nil {
		c.server.Stop()
	}
}
