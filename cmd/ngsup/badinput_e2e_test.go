package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

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
