package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// wantUsageError checks that r is the contract's answer to bad input: exit 2,
// exactly one line on stderr that contains every word of names, nothing on
// stdout.
func wantUsageError(t *testing.T, r outcome, names ...string) {
	t.Helper()
	if r.code != proto.ExitUsage {
		t.Errorf("want exit 2:\n%v", r)
		return
	}
	msg := strings.TrimRight(r.stderr, "\n")
	if msg == "" || strings.Contains(msg, "\n") {
		t.Errorf("want one line on stderr, got %q", r.stderr)
	}
	for _, n := range names {
		if !strings.Contains(msg, n) {
			t.Errorf("stderr %q does not name %q", msg, n)
		}
	}
	if r.stdout != "" {
		t.Errorf("stdout should be empty on a usage error, got %q", r.stdout)
	}
}

// verbArgs is a verb's command line on dir (dir "" leaves --dir out).
func verbArgs(verb, dir string) []string {
	var args []string
	switch verb {
	case "run":
		args = []string{"run", "--id", "e2e-bad-input"}
	default:
		args = []string{verb}
	}
	if dir != "" {
		args = append(args, "--dir", dir)
	}
	switch verb {
	case "run":
		args = append(args, "--", "/bin/true")
	case "wait":
		args = append(args, "--timeout", "1s")
	case "stop":
		args = append(args, "--grace", "0s")
	}
	return args
}

var allVerbs = []string{"run", "wait", "pause", "continue", "stop", "status", "tree"}

// TestBadInputDir proves that a relative --dir and a missing --dir get exit 2
// and one line on stderr naming the problem, from every verb, and that
// nothing is created.
func TestBadInputDir(t *testing.T) {
	t.Parallel()
	cwd := t.TempDir()
	for _, verb := range allVerbs {
		t.Run(verb+"/relative", func(t *testing.T) {
			r := ngsupIn(t, cwd, verbArgs(verb, "relative/launch")...)
			wantUsageError(t, r, "relative/launch", "absolute")
		})
		t.Run(verb+"/missing", func(t *testing.T) {
			r := ngsupIn(t, cwd, verbArgs(verb, "")...)
			if verb == "tree" {
				wantUsageError(t, r, "--dir", "--pid")
			} else {
				wantUsageError(t, r, "--dir")
			}
		})
	}
	if ents, _ := os.ReadDir(cwd); len(ents) != 0 {
		t.Errorf("bad --dir created %v in the working folder", ents)
	}
}

// ngsupIn runs ngsup in the working folder dir.
func ngsupIn(t *testing.T, dir string, args ...string) outcome {
	t.Helper()
	return runNgsup(t, dir, nil, args...)
}

// TestBadInputID proves that `run --id` with a slash (or another character
// that is not allowed) exits 2 naming it, and starts nothing.
func TestBadInputID(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"a/b", "x/../escape", "with space", ""} {
		t.Run(id, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "launch")
			marker := filepath.Join(t.TempDir(), "marker")
			for _, detach := range []bool{false, true} {
				args := []string{"run", "--dir", dir, "--id", id}
				if detach {
					args = append(args, "--detach")
				}
				args = append(args, "--", "/bin/sh", "-c", "touch "+marker)
				r := ngsup(t, args...)
				switch id {
				case "":
					wantUsageError(t, r, "id", "empty")
				case "a/b", "x/../escape":
					wantUsageError(t, r, id, "slash")
				default:
					wantUsageError(t, r, id)
				}
			}
			time.Sleep(100 * time.Millisecond)
			if exists(marker) || exists(filepath.Join(dir, proto.ReceiptFile)) {
				t.Errorf("a bad id started a launch")
			}
		})
	}
}

// TestBadInputReceipt proves that a truncated receipt, a garbage receipt and
// a receipt of an unknown format version get exit 2 from every verb, with one
// line on stderr naming the problem, and that the receipt file is
// byte-for-byte unchanged and no other file appears in the folder.
func TestBadInputReceipt(t *testing.T) {
	t.Parallel()
	good, err := proto.EncodeReceipt(&proto.Receipt{
		Version: proto.ReceiptVersion, ID: "e2e-receipt", Command: []string{"/bin/true"},
		SupervisorPID: 1, SupervisorStartTicks: 1, Started: true, HarnessPID: 1, HarnessPGID: 1,
		StartedAt: time.Now(), ExitCode: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	v99, err := msgpack.Marshal(&proto.Receipt{Version: 99, ID: "e2e-receipt", SupervisorPID: 1, ExitCode: -1})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		data  []byte
		names []string
	}{
		{"truncated", good[:len(good)/2], []string{"receipt", "truncated"}},
		{"garbage", []byte("this is not a receipt\x00\xff\xfe"), []string{"receipt", "corrupt"}},
		{"empty", []byte{}, []string{"receipt", "empty"}},
		{"version99", v99, []string{"version", "99"}},
	}
	for _, c := range cases {
		for _, verb := range allVerbs {
			t.Run(c.name+"/"+verb, func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "launch")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				receipt := filepath.Join(dir, proto.ReceiptFile)
				if err := os.WriteFile(receipt, c.data, 0o644); err != nil {
					t.Fatal(err)
				}
				r := ngsup(t, verbArgs(verb, dir)...)
				if verb == "run" {
					// run never reads an old receipt: the folder is taken.
					wantUsageError(t, r, "already holds a launch")
				} else {
					wantUsageError(t, r, c.names...)
				}
				if got, _ := os.ReadFile(receipt); !bytes.Equal(got, c.data) {
					t.Errorf("the receipt changed: %q -> %q", c.data, got)
				}
				if verb != "run" {
					if names := dirNames(dir); !slices.Equal(names, []string{proto.ReceiptFile}) {
						t.Errorf("%s on a bad receipt left files: %v", verb, names)
					}
				}
			})
		}
	}
}

func dirNames(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestBadInputRunIntoExistingLaunch proves that `run` into a folder that
// already holds a launch exits 2 naming it, foreground and detached, runs
// nothing, and leaves the receipt byte-for-byte unchanged.
func TestBadInputRunIntoExistingLaunch(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-exit", "0"))
	l.wait()
	receipt := filepath.Join(l.Dir, proto.ReceiptFile)
	before := readFile(receipt)
	marker := filepath.Join(l.Rec, "marker")
	for _, detach := range []bool{false, true} {
		cmd := helper("harness", "-marker", marker, "-exit", "0")
		r := ngsupEnv(t, l.runEnv(cmd), l.runArgs(detach, nil, cmd)...)
		wantUsageError(t, r, "already holds a launch", l.Dir)
	}
	time.Sleep(200 * time.Millisecond)
	if exists(marker) {
		t.Errorf("a second run into the folder started its harness")
	}
	if after := readFile(receipt); !bytes.Equal(before, after) {
		t.Errorf("the receipt changed")
	}
}

// TestBadInputDirIsAFile proves that every verb but run, given --dir naming
// a regular file, exits 2 with one line naming it (status used to exit 1).
func TestBadInputDirIsAFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, []byte("not a folder\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, verb := range allVerbs {
		if verb == "run" {
			continue
		}
		t.Run(verb, func(t *testing.T) {
			wantUsageError(t, ngsup(t, verbArgs(verb, file)...), file, "not a folder")
		})
	}
}

// TestBadInputUnwritableDir proves that pause, continue and stop on a
// folder they cannot write in (/proc/1) exit 2 with one line naming it and
// saying nothing was done (they used to exit 1).
func TestBadInputUnwritableDir(t *testing.T) {
	t.Parallel()
	for _, verb := range []string{"pause", "continue", "stop"} {
		t.Run(verb, func(t *testing.T) {
			wantUsageError(t, ngsup(t, verbArgs(verb, "/proc/1")...), "/proc/1", "nothing was")
		})
	}
}

// TestBadInputReadOnlyDir proves that pause, continue and stop on a launch
// whose folder is read-only (a read-only bind mount of it) exit 2 with one
// line naming the folder and saying nothing was done, and that indeed every
// process of the launch still runs.
func TestBadInputReadOnlyDir(t *testing.T) {
	t.Parallel()
	requireRoot(t, "a read-only bind mount needs root")
	l := newLaunch(t)
	l.detach([]string{"--no-cgroup"}, helper("harness", "-bg", "-setsid"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid"} {
		procs[role] = l.role(role)
	}
	if err := unix.Mount(l.Dir, l.Dir, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount the launch folder: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(l.Dir, unix.MNT_DETACH) }) // runs before the launch's cleanup
	if err := unix.Mount("", l.Dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot remount the launch folder read-only: %v", err)
	}
	for _, verb := range []string{"pause", "continue", "stop"} {
		r := ngsup(t, verbArgs(verb, l.Dir)...)
		wantUsageError(t, r, l.Dir, "read-only", "nothing was")
		for _, name := range sortedKeys(procs) {
			if ok, why := running(procs[name]); !ok {
				t.Errorf("after %s on a read-only folder: %s", verb, why)
			}
		}
	}
}

// TestBadInputStopByTagWithCorruptReceipt proves that `stop --id ID` on a
// launch whose receipt is garbage (its supervisor gone) still stops it, by
// its tag: exit 0, every process gone, the reply saying the receipt was
// unreadable and the stop partial, and the receipt left as it was.
func TestBadInputStopByTagWithCorruptReceipt(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach([]string{"--no-cgroup"}, helper("harness", "-bg", "-setsid", "-daemon"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid", "daemon"} {
		procs[role] = l.role(role)
	}
	sup := proc{l.Sup.PID, l.Sup.StartTicks}
	if err := unix.Kill(sup.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wantGone(t, map[string]proc{"supervisor": sup})
	receipt := filepath.Join(l.Dir, proto.ReceiptFile)
	garbage := []byte("this is not a receipt\x00\xff\xfe")
	if err := os.WriteFile(receipt, garbage, 0o644); err != nil {
		t.Fatal(err)
	}
	r := l.verb("stop", "--id", l.ID, "--grace", "1s")
	wantCode(t, r, 0)
	var res proto.StopResult
	r.json(t, &res)
	wantGone(t, procs)
	if !res.Stopped || !res.Partial || !strings.Contains(res.ReceiptError, "corrupt") || !slices.Contains(res.Searched, proto.SourceTag) {
		t.Errorf("stop: stopped %v partial %v receipt_error %q searched %v, want true true corrupt [...tag]", res.Stopped, res.Partial, res.ReceiptError, res.Searched)
	}
	if !strings.Contains(r.stderr, "receipt") {
		t.Errorf("stderr does not say the receipt was unreadable: %q", r.stderr)
	}
	if got := readFile(receipt); !bytes.Equal(got, garbage) {
		t.Errorf("the receipt changed: %q", got)
	}
}

// TestBadInputHugeReceipt proves that a 4 GiB receipt (a sparse file) is not
// read into memory: every verb but run exits 2 with one line naming the
// receipt, its size and the limit.
func TestBadInputHugeReceipt(t *testing.T) {
	t.Parallel()
	for _, verb := range allVerbs {
		if verb == "run" {
			continue
		}
		t.Run(verb, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "launch")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			receipt := filepath.Join(dir, proto.ReceiptFile)
			if err := os.WriteFile(receipt, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			const size = 4 << 30
			if err := os.Truncate(receipt, size); err != nil {
				t.Fatal(err)
			}
			r := ngsup(t, verbArgs(verb, dir)...)
			wantUsageError(t, r, "receipt", strconv.Itoa(size), strconv.Itoa(proto.MaxReceiptBytes))
			if fi, err := os.Stat(receipt); err != nil || fi.Size() != size {
				t.Errorf("the receipt changed: %v %v", fi, err)
			}
		})
	}
}
