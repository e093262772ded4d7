// Package sigmasupervise_e2e is the σOS client of scripts/sigmaos-e2e: it spawns procs on a
// one-machine σOS that the script booted, and judges them by σOS's own records (Started, Exited,
// the exit status) and by what the procs wrote to named.
//
// It is ours, not σOS's: scripts/sigmaos-e2e copies this directory into an extracted σOS tree
// (as ./sigmasupervise_e2e) and builds it there with `go test -c`, because σOS's module path
// `sigmaos` cannot be fetched as a dependency. Run it as the script does:
//
//	e2e.test -etcdIP 127.0.0.1 -nodialproxy -no-shutdown -test.v
//
// Every proof is one row of the `cases` table below; every wait has a deadline, so a proc that
// σOS never records as exited fails its row instead of hanging the run.
package sigmasupervise_e2e

import (
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"sigmaos/proc"
	sp "sigmaos/sigmap"
	"sigmaos/test"
)

var (
	rounds  = flag.Int("e2e.rounds", 5, "spawns of the timed sleeper case (its median is reported)")
	waitFor = flag.Duration("e2e.wait", 30*time.Second, "deadline of each WaitStart and WaitExit")
	gapWait = flag.Duration("e2e.gap-wait", 5*time.Second, "how long a known gap's silence is awaited")
	// The upstream trampoline leaves gaps that a trampoline of ours must close: with this flag
	// a case that names a gap proves the gap (σOS stays silent) instead of failing on it.
	upstream = flag.Bool("e2e.upstream", false, "the installed trampoline is σOS's own")
)

// want is what σOS must have recorded for a proc.
type want int

const (
	wantOK      want = iota // Started, then Exited with status OK
	wantError               // status ERROR (a non-zero exit or a signal without Exited)
	wantEvicted             // status EVICTED (after the client's Evict)
)

// spawnCase is one proof: a program σOS runs through the installed uproc-trampoline.
type spawnCase struct {
	name    string
	prog    string
	args    func(pid sp.Tpid) []string
	started bool // the proc calls Started: WaitStart must return
	want    want
	msg     string // a wantError status's message must contain it
	// oursMsg, if set, is the message through sigma-supervise instead.
	oursMsg string
	// ours: a proof of sigma-supervise's trampoline (a Python proc, the σcontainer); skipped
	// under -e2e.upstream, whose trampoline has no Python interpreter of its own.
	ours bool
	// spproxy: the proc speaks to σOS through spproxyd (pysigma): its ProcEnv says UseSPProxy,
	// so procd tells spproxyd of it before it starts (spproxyd serves no Init of an unknown
	// proc), and UseSPProxyProcClnt, so spproxyd makes the proc client Started and Exited use.
	spproxy bool
	// evict: once the proc has started, the client evicts it (σOS's Evict, through msched and
	// procd to the proc's WaitEvict).
	evict bool
	// check, if set, runs after a passing exit (e.g. reads what the proc wrote to named).
	check func(t *testing.T, ts *test.Tstate, pid sp.Tpid)
	// upstreamGap, if set, says what the upstream trampoline leaves undone here: under
	// -e2e.upstream the case passes when WaitExit stays unanswered for -e2e.gap-wait.
	upstreamGap string
}

var cases = []spawnCase{
	{
		name:    "sleeper",
		prog:    "sleeper",
		args:    func(sp.Tpid) []string { return []string{"0ms", "name/"} },
		started: true,
		want:    wantOK,
		check:   checkSleeperOut,
	},
	// σOS's sleeper again, its σOS client in spproxyd: it dials /tmp/spproxyd/spproxyd.sock
	// itself (the jail shows that socket and nothing else of the directory).
	{
		name: "sleeper-spproxy", spproxy: true, prog: "sleeper",
		args:    func(sp.Tpid) []string { return []string{"0ms", "name/"} },
		started: true, want: wantOK, check: checkSleeperOut,
	},
	// The programs below are ours (tests/sigmaos/procs/, installed as e2e-<name>-v1.0) and
	// never speak to σOS: procd's own record of how they ended is what is checked.
	{name: "exit1", prog: "e2e-exit1", args: noArgs, want: wantError, msg: "(exit status 1)"},
	{
		name: "python-segv", prog: "e2e-segv", args: noArgs, want: wantError,
		msg: "(signal: segmentation fault)",
	},
	{
		name: "exit0-without-exited", prog: "e2e-exit0", args: noArgs, want: wantError,
		oursMsg:     "(exit status 125)",
		upstreamGap: "an exit 0 without Exited is recorded nowhere: WaitExit never answers",
	},
	// Python procs (tests/sigmaos/procs/*.py, installed as e2e-NAME.py-v1.0), run by the
	// interpreter trampoline.toml names: a venv with the pysigma wheel.
	{name: "python-hello", spproxy: true, prog: "e2e-hello.py", args: noArgs, started: true, want: wantOK, ours: true},
	{
		name: "python-stdlib", spproxy: true, prog: "e2e-stdlib.py", args: outArg, started: true, want: wantOK,
		ours: true, check: checkStdlib,
	},
	{
		name: "python-splib", spproxy: true, prog: "e2e-splib.py", started: true, want: wantOK, ours: true,
		args: func(pid sp.Tpid) []string { return []string{outName(pid), "σPy says hello to " + pid.String()} },
		check: func(t *testing.T, ts *test.Tstate, pid sp.Tpid) {
			b := readOut(t, ts, pid)
			if want := "σPy says hello to " + pid.String(); string(b) != want {
				t.Errorf("%v holds %q, want %q", outPath(pid), b, want)
			}
		},
	},
	{
		name: "python-realm-lib", spproxy: true, prog: "e2e-realm.py", started: true, want: wantOK,
		ours: true, args: func(pid sp.Tpid) []string { return []string{outName(pid), "σOS"} },
		check: checkRealm,
	},
	// pysigma's calls against σOS's own spproxyd: the same program pysigma's tests run
	// against the embedded server (pysigma/tests/test_supervised.py); both must pass every check.
	{
		name: "python-api", spproxy: true, prog: "e2e-api.py", args: outArg, started: true, want: wantOK,
		ours: true, check: checkAllOK,
	},
	{
		name: "python-wait-evict", spproxy: true, prog: "e2e-evict.py", args: noArgs, started: true,
		want: wantEvicted, ours: true, evict: true,
	},
	{
		name: "confinement", spproxy: true, prog: "e2e-confine.py", args: outArg, started: true, want: wantOK,
		ours: true, check: checkConfined,
	},
}

// outName is the file a proc writes in ux: e2e-<pid>.
func outName(pid sp.Tpid) string  { return "e2e-" + pid.String() }
func outPath(pid sp.Tpid) string  { return "name/ux/~local/" + outName(pid) }
func outArg(pid sp.Tpid) []string { return []string{outName(pid)} }

// readOut reads (and removes) what the proc wrote to name/ux/~local/e2e-<pid>.
func readOut(t *testing.T, ts *test.Tstate, pid sp.Tpid) []byte {
	b, err := ts.GetFile(outPath(pid))
	if err != nil {
		t.Fatalf("%v: %v", outPath(pid), err)
	}
	ts.Remove(outPath(pid))
	return b
}

// checkStdlib: the program's results, computed here the same way.
func checkStdlib(t *testing.T, ts *test.Tstate, pid sp.Tpid) {
	var got map[string]any
	b := readOut(t, ts, pid)
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v: %v (%q)", outPath(pid), err, b)
	}
	want := map[string]any{
		"sha256": fmt.Sprintf("%x", sha256.Sum256([]byte(strings.Repeat("sigma", 1000)))),
		"rows":   3.0, "zlib": true, "re": true, "thread": 42.0, "child": "ok",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("stdlib %v = %v, want %v (all: %s)", k, got[k], v, b)
		}
	}
}

// checkRealm: greet (examples/demo-lib, only in the realm's bucket) answered, from the realm.
func checkRealm(t *testing.T, ts *test.Tstate, pid sp.Tpid) {
	var got map[string]string
	b := readOut(t, ts, pid)
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v: %v (%q)", outPath(pid), err, b)
	}
	digest := fmt.Sprintf("%x", sha256.Sum256([]byte("σOS")))[:12]
	want := "hello, σOS (sha256 " + digest + ") from a library fetched at import time"
	if got["hello"] != want {
		t.Errorf("greet.hello: %q, want %q", got["hello"], want)
	}
	fmt.Printf("E2E realm greet from %v\n", got["file"])
}

// checkConfined: every attempt refused or its target absent from the proc's world.
func checkConfined(t *testing.T, ts *test.Tstate, pid sp.Tpid) {
	var got map[string]string
	b := readOut(t, ts, pid)
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v: %v (%q)", outPath(pid), err, b)
	}
	for _, k := range []string{
		"aws-credentials", "binfs", "binfs-sleeper", "jails", "kernel-bin", "kernel-procd",
		"user-bin", "staging", "etcd-data", "spproxyd-dir", "trampoline-cache", "ptrace-attach-parent",
		"mount-tmpfs", "unshare-user", "chroot", "tcp-etcd", "fds",
	} {
		v, ok := got[k]
		confined := strings.HasPrefix(v, "refused: ") || v == "hidden" || v == "LISTED []"
		// No descriptor of procd's reaches the proc: its σOS connection (and copies) only.
		if k == "fds" && v == "none beyond the σOS connection" {
			confined = true
		}
		// The staging directory may show the interpreter's venv (its prefix), nothing else.
		if k == "staging" && v == "LISTED ['venv']" {
			confined = true
		}
		if !ok || !confined {
			t.Errorf("confinement: %v: %q", k, v)
		}
		fmt.Printf("E2E confinement %v: %v\n", k, v)
	}
}

func noArgs(sp.Tpid) []string { return nil }

// checkAllOK: every check the proc reported (JSON, name → "ok" or "FAILED: why") passed.
func checkAllOK(t *testing.T, ts *test.Tstate, pid sp.Tpid) {
	var got map[string]string
	b := readOut(t, ts, pid)
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v: %v (%q)", outPath(pid), err, b)
	}
	if len(got) == 0 {
		t.Fatalf("%v: no check reported", outPath(pid))
	}
	names := make([]string, 0, len(got))
	for k := range got {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if got[k] != "ok" {
			t.Errorf("%v: %v", k, got[k])
		}
		fmt.Printf("E2E api %v: %v\n", k, got[k])
	}
}

// checkSleeperOut: σOS's sleeper writes "hello" to name/<pid>_out through the σOS API.
func checkSleeperOut(t *testing.T, ts *test.Tstate, pid sp.Tpid) {
	pn := "name/" + pid.String() + "_out"
	b, err := ts.GetFile(pn)
	if err != nil {
		t.Errorf("%v: %v", pn, err)
		return
	}
	if string(b) != "hello" {
		t.Errorf("%v holds %q, want \"hello\"", pn, b)
	}
	ts.Remove(pn)
}

// within runs f with a deadline; past it the call is abandoned (σOS offers no cancel) and the
// proof fails.
func within[T any](d time.Duration, what string, f func() (T, error)) (T, error) {
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	go func() {
		v, err := f()
		ch <- res{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(d):
		var zero T
		return zero, fmt.Errorf("%v: no answer within %v", what, d)
	}
}

// runCase spawns one proc and checks σOS's records; it returns the time from Spawn to the
// return of WaitExit.
func runCase(t *testing.T, ts *test.Tstate, c spawnCase) time.Duration {
	pid := sp.GenPid(c.prog)
	p := proc.NewProcPid(pid, c.prog, c.args(pid))
	if c.spproxy {
		p.GetProcEnv().UseSPProxy = true
		p.GetProcEnv().UseSPProxyProcClnt = true
	}
	start := time.Now()
	if err := ts.Spawn(p); err != nil {
		t.Fatalf("Spawn %v: %v", pid, err)
	}
	if c.started {
		if _, err := within(*waitFor, "WaitStart "+pid.String(), func() (struct{}, error) {
			return struct{}{}, ts.WaitStart(pid)
		}); err != nil {
			t.Fatalf("WaitStart %v: %v", pid, err)
		}
	}
	if c.evict {
		if err := ts.Evict(pid); err != nil {
			t.Fatalf("Evict %v: %v", pid, err)
		}
	}
	if c.upstreamGap != "" && *upstream {
		_, err := within(*gapWait, "WaitExit "+pid.String(), func() (*proc.Status, error) {
			return ts.WaitExit(pid)
		})
		if err == nil {
			t.Fatalf("%v: known upstream gap (%v) not seen: WaitExit answered", pid, c.upstreamGap)
		}
		fmt.Printf("E2E gap %v: %v (no answer in %v)\n", c.name, c.upstreamGap, *gapWait)
		return 0
	}
	status, err := within(*waitFor, "WaitExit "+pid.String(), func() (*proc.Status, error) {
		return ts.WaitExit(pid)
	})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("WaitExit %v: %v", pid, err)
	}
	switch c.want {
	case wantOK:
		if status == nil || !status.IsStatusOK() {
			t.Fatalf("%v: status %v, want OK", pid, status)
		}
	case wantEvicted:
		if status == nil || !status.IsStatusEvicted() {
			t.Fatalf("%v: status %v, want EVICTED", pid, status)
		}
	case wantError:
		if status == nil || !status.IsStatusErr() {
			t.Fatalf("%v: status %v, want ERROR", pid, status)
		}
		msg := c.msg
		if c.oursMsg != "" && !*upstream {
			msg = c.oursMsg
		}
		if !strings.Contains(status.Msg(), msg) {
			t.Fatalf("%v: status message %q lacks %q", pid, status.Msg(), msg)
		}
		fmt.Printf("E2E status %v: %v\n", c.name, status.Msg())
	}
	if c.check != nil {
		c.check(t, ts, pid)
	}
	return elapsed
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestProcs runs every case once, then the timed cases `-e2e.rounds` times each: σOS's sleeper,
// and (through sigma-supervise) the Python hello world. The script greps the "E2E" lines.
func TestProcs(t *testing.T) {
	ts, err := test.NewTstateAll(t)
	if err != nil {
		t.Fatalf("connect to σOS: %v", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.ours && *upstream {
				fmt.Printf("E2E skip %v: a proof of sigma-supervise's trampoline\n", c.name)
				t.Skip("a proof of sigma-supervise's trampoline")
			}
			d := runCase(t, ts, c)
			fmt.Printf("E2E case %v ok spawn-to-exit %v\n", c.name, d.Round(time.Millisecond))
		})
	}
	for _, name := range []string{"sleeper", "python-hello"} {
		c := caseNamed(name)
		if c.ours && *upstream {
			continue
		}
		t.Run("timing-"+name, func(t *testing.T) {
			var ds []time.Duration
			for i := 0; i < *rounds; i++ {
				ds = append(ds, runCase(t, ts, c))
			}
			fmt.Printf("E2E timing %v spawn-to-exit median %v of %d (all %v)\n", c.name,
				median(ds).Round(time.Millisecond), len(ds), ds)
		})
	}
}

func caseNamed(name string) spawnCase {
	for _, c := range cases {
		if c.name == name {
			return c
		}
	}
	panic("no case " + name)
}
