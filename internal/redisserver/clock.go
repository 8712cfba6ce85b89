package redisserver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config.ClockOffset runs redis-server with LD_PRELOAD of a tiny library (clockShimSource)
// that adds an offset to the wall clock: clock_gettime(CLOCK_REALTIME[_COARSE]),
// gettimeofday and time. It reads the time with the raw syscall, so it needs no dlsym and
// no malloc.
//
// Why not libfaketime: verified on Debian 12 with libfaketime 0.9.10 and redis-server
// 7.0.15 (linked to libjemalloc.so.2), both libfaketime.so.1 and libfaketimeMT.so.1
// deadlock redis-server at start: jemalloc's initialisation calls clock_gettime, libfaketime
// initialises in it and dlsym()s symbols glibc 2.36 no longer has (__ftime, __time,
// timer_settime@GLIBC_2.2), glibc mallocs the dlerror message, and that malloc waits on
// jemalloc's init lock forever (libfaketime issue #130). The shim is built once per machine
// with the system C compiler ($CC, cc, gcc or clang) and cached in the user cache dir.

// clockShimSource is the LD_PRELOAD library. DLOCK_CLOCK_OFFSET_NS is the offset.
const clockShimSource = `// Built by github.com/dlock-go/dlock/internal/redisserver: shifts the wall clock.
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ns;
static int loaded;

static long long offset(void) {
	if (!__atomic_load_n(&loaded, __ATOMIC_ACQUIRE)) {
		const char *s = getenv("DLOCK_CLOCK_OFFSET_NS");
		__atomic_store_n(&offset_ns, s ? strtoll(s, NULL, 10) : 0, __ATOMIC_RELAXED);
		__atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
	}
	return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
}

static int realtime(struct timespec *ts) {
	if (syscall(SYS_clock_gettime, CLOCK_REALTIME, ts) != 0) return -1;
	long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset();
	ts->tv_sec = ns / 1000000000LL;
	ts->tv_nsec = ns % 1000000000LL;
	if (ts->tv_nsec < 0) { ts->tv_nsec += 1000000000LL; ts->tv_sec--; }
	return 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	if (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) return realtime(ts);
	return (int)syscall(SYS_clock_gettime, id, ts);
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	struct timespec ts;
	if (realtime(&ts) != 0) return -1;
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000;
	if (tz) { struct timezone *z = tz; z->tz_minuteswest = 0; z->tz_dsttime = 0; }
	return 0;
}

time_t time(time_t *t) {
	struct timespec ts;
	if (realtime(&ts) != 0) return (time_t)-1;
	if (t) *t = ts.tv_sec;
	return ts.tv_sec;
}
`

var (
	shimMu   sync.Mutex
	shimPath string
)

// clockEnv returns the environment that runs redis-server with its wall clock shifted by
// offset (see Config.ClockOffset); nothing for an empty offset.
func clockEnv(offset string) ([]string, error) {
	if offset == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(offset))
	if err != nil {
		return nil, fmt.Errorf("redisserver: ClockOffset %q: want a Go duration such as \"+2s\": %v", offset, err)
	}
	shim, err := clockShim()
	if err != nil {
		return nil, err
	}
	preload := shim
	if old := os.Getenv("LD_PRELOAD"); old != "" {
		preload += " " + old
	}
	return []string{"LD_PRELOAD=" + preload, "DLOCK_CLOCK_OFFSET_NS=" + strconv.FormatInt(int64(d), 10)}, nil
}

// clockShim returns the path of the built shim, building it on first use.
func clockShim() (string, error) {
	shimMu.Lock()
	defer shimMu.Unlock()
	if shimPath != "" {
		return shimPath, nil
	}
	sum := sha256.Sum256([]byte(clockShimSource))
	dir, err := os.UserCacheDir()
	if err != nil || os.MkdirAll(filepath.Join(dir, "dlock-redisserver"), 0o755) != nil {
		dir = os.TempDir()
	}
	dir = filepath.Join(dir, "dlock-redisserver")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "clockshift-"+hex.EncodeToString(sum[:6])+".so")
	if _, err := os.Stat(path); err == nil {
		shimPath = path
		return path, nil
	}
	cc, err := cCompiler()
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "clockshift.c")
	if err := os.WriteFile(src, []byte(clockShimSource), 0o644); err != nil {
		return "", err
	}
	so := filepath.Join(tmp, "clockshift.so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", so, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("redisserver: build the ClockOffset shim with %s: %v\n%s", cc, err, out)
	}
	if err := os.Rename(so, path); err != nil { // atomic: a parallel build by another process is identical
		return "", err
	}
	shimPath = path
	return path, nil
}

// cCompiler finds the C compiler for the shim.
func cCompiler() (string, error) {
	names := []string{"cc", "gcc", "clang"}
	if cc := os.Getenv("CC"); cc != "" {
		names = append([]string{cc}, names...)
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("redisserver: Config.ClockOffset needs a C compiler to build its clock shim (libfaketime deadlocks in redis-server): install one with `apt-get install -y gcc` (Debian)")
}
