package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	// The demo re-runs its own executable as workers: here that is the test binary.
	if len(os.Args) > 1 && os.Args[1] == workerCommand {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(redistest.Main(m))
}

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestDemoTicketsLockedRunIsExact(t *testing.T) {
	code, out, errs := runCLI(t, "demo", "--redis", redistest.Shared(t).URL(), "tickets")
	if code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	if !strings.Contains(out, "with dlock  8     2        0             exact") {
		t.Fatalf("locked run not exact:\n%s", out)
	}
	if !strings.Contains(out, "no lock     10") {
		t.Logf("the unlocked run happened not to oversell this time:\n%s", out)
	}
}

func TestBadCommandLinesGiveOneClearError(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `dlock: error: unknown command "frobnicate"`},
		{[]string{"demo", "nope"}, `dlock: error: unknown demo scenario "nope"`},
		{[]string{"demo", "--redis", "bogus://x"}, `dlock: error: bad Redis URL "bogus://x"`},
		{[]string{"demo", "--redis", "unix:///nonexistent/redis.sock"}, "dlock: error: cannot reach Redis"},
	}
	for _, tc := range cases {
		code, _, errs := runCLI(t, tc.args...)
		if code == 0 || !strings.HasPrefix(errs, tc.want) || !strings.Contains(errs, "dlock: hint: ") {
			t.Errorf("dlock %v: exit %d, stderr %q; want a failure starting %q with a hint", tc.args, code, errs, tc.want)
		}
	}
}
