package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/proto"
)

// decodeLines decodes every line of r's stdout into a T, strictly (no
// unknown field), and wants exactly n lines.
func decodeLines[T any](t *testing.T, r outcome, n int) []T {
	t.Helper()
	text := strings.TrimRight(r.stdout, "\n")
	var out []T
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			continue
		}
		var v T
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("line %q is not one %T: %v\n%v", line, v, err, r)
		}
		out = append(out, v)
	}
	if len(out) != n {
		t.Fatalf("want %d lines of JSON, got %d:\n%v", n, len(out), r)
	}
	return out
}

// dirArgs is verb with --dir for every folder.
func dirArgs(verb string, dirs ...string) []string {
	args := []string{verb}
	for _, d := range dirs {
		args = append(args, "--dir", d)
	}
	return args
}

// startRunning starts a launch whose harness runs with a child in its group
// and one in a session of its own, and returns it with its processes.
func startRunning(t *testing.T) (*launch, map[string]proc) {
	t.Helper()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg", "-setsid"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid"} {
		procs[role] = l.role(role)
	}
	return l, procs
}

// TestPauseSeveralDirs proves the batched form of pause and continue: one
// `ngsup pause` with four --dir, one of them a launch that had already
// ended, prints one line per --dir in the order given, each the usual
// PauseResult plus "dir" and "code"; the ended one says code 3 (its receipt
// untouched, no pause file left), the others code 0 with every process
// held; the process exits 3. One `ngsup continue` with the three paused
// folders prints three lines with code 0, exits 0, and every process runs
// again with the pause files gone.
func TestPauseSeveralDirs(t *testing.T) {
	t.Parallel()
	a, pa := startRunning(t)
	b, pb := startRunning(t)
	c, pc := startRunning(t)
	ended := newLaunch(t)
	ended.detach(nil, helper("harness", "-exit", "0"))
	ended.wait()
	receipt := filepath.Join(ended.Dir, proto.ReceiptFile)
	before := readFile(receipt)

	r := ngsup(t, dirArgs("pause", a.Dir, b.Dir, ended.Dir, c.Dir)...)
	wantCode(t, r, proto.ExitEnded)
	lines := decodeLines[proto.PauseLine](t, r, 4)
	for i, want := range []struct {
		l    *launch
		code int
	}{{a, 0}, {b, 0}, {ended, proto.ExitEnded}, {c, 0}} {
		got := lines[i]
		if got.Dir != want.l.Dir || got.Code != want.code {
			t.Errorf("line %d: dir %q code %d, want %q %d", i, got.Dir, got.Code, want.l.Dir, want.code)
		}
		if want.code == 0 && (!got.Paused || got.Processes < 3 || len(got.Pending) != 0 || !got.Supervised) {
			t.Errorf("line %d: want a confirmed pause of at least 3 processes: %+v", i, got)
		}
		if want.code == proto.ExitEnded && (got.Paused || !got.Ended || got.Processes != 0) {
			t.Errorf("line %d: want the ended launch left alone: %+v", i, got)
		}
	}
	for _, procs := range []map[string]proc{pa, pb, pc} {
		wantHeld(t, procs)
	}
	if after := readFile(receipt); !bytes.Equal(before, after) {
		t.Errorf("the ended launch's receipt changed")
	}
	for _, f := range []string{proto.PauseFile, proto.PausedFile} {
		if exists(filepath.Join(ended.Dir, f)) {
			t.Errorf("the pause of the ended launch left %s behind", f)
		}
	}

	r = ngsup(t, dirArgs("continue", a.Dir, b.Dir, c.Dir)...)
	wantCode(t, r, 0)
	clines := decodeLines[proto.ContinueLine](t, r, 3)
	for i, l := range []*launch{a, b, c} {
		got := clines[i]
		if got.Dir != l.Dir || got.Code != 0 || got.Error != "" || got.Continued < 3 || len(got.Pending) != 0 {
			t.Errorf("continue line %d: %+v, want dir %q code 0, at least 3 continued", i, got, l.Dir)
		}
		if exists(filepath.Join(l.Dir, proto.PauseFile)) {
			t.Errorf("continue left the pause file of %s", l.Dir)
		}
	}
	for _, procs := range []map[string]proc{pa, pb, pc} {
		waitRunning(t, procs)
	}
}

// TestPauseSeveralDirsBadFolder proves that a bad folder among good ones
// costs only its own line: pause with a relative --dir and a --dir that is
// a file between two running launches prints code 2 with an error naming
// each bad folder (and says so on stderr), pauses the two launches (every
// process held, code 0), and exits 2. A continue with a folder that does
// not exist between them likewise continues both and exits 2.
func TestPauseSeveralDirsBadFolder(t *testing.T) {
	t.Parallel()
	a, pa := startRunning(t)
	b, pb := startRunning(t)
	file := filepath.Join(t.TempDir(), "not-a-folder")
	touchFile(t, file)

	r := ngsup(t, dirArgs("pause", a.Dir, "relative/launch", file, b.Dir)...)
	wantCode(t, r, proto.ExitUsage)
	lines := decodeLines[proto.PauseLine](t, r, 4)
	for i, l := range []*launch{a, b} {
		got := lines[3*i]
		if got.Dir != l.Dir || got.Code != 0 || !got.Paused {
			t.Errorf("line %d: %+v, want dir %q paused with code 0", 3*i, got, l.Dir)
		}
	}
	for i, bad := range []string{"relative/launch", file} {
		got := lines[1+i]
		if got.Dir != bad || got.Code != proto.ExitUsage || got.Paused || !strings.Contains(got.Error, bad) {
			t.Errorf("line %d: %+v, want code 2 with an error naming %q", 1+i, got, bad)
		}
		if !strings.Contains(r.stderr, bad) {
			t.Errorf("stderr does not name %q: %q", bad, r.stderr)
		}
	}
	wantHeld(t, pa)
	wantHeld(t, pb)

	missing := filepath.Join(t.TempDir(), "no-such-launch")
	r = ngsup(t, dirArgs("continue", a.Dir, missing, b.Dir)...)
	wantCode(t, r, proto.ExitUsage)
	clines := decodeLines[proto.ContinueLine](t, r, 3)
	if got := clines[1]; got.Dir != missing || got.Code != proto.ExitUsage || !strings.Contains(got.Error, missing) {
		t.Errorf("continue line 1: %+v, want code 2 naming %q", got, missing)
	}
	for i, l := range []*launch{a, b} {
		if got := clines[2*i]; got.Dir != l.Dir || got.Code != 0 {
			t.Errorf("continue line %d: %+v, want dir %q code 0", 2*i, got, l.Dir)
		}
	}
	if exists(missing) {
		t.Errorf("continue created the missing folder %s", missing)
	}
	waitRunning(t, pa)
	waitRunning(t, pb)
}

// TestPauseOneDirUnchanged proves that the batched form is an addition
// only: with one --dir, pause and continue print the same one object as
// before (no "dir", no "code": decoded strictly into PauseResult and
// ContinueResult); --id with several --dir is refused with exit 2 and one
// line on stderr, before anything is touched (no pause file in either
// folder).
func TestPauseOneDirUnchanged(t *testing.T) {
	t.Parallel()
	l, procs := startRunning(t)
	r := l.verb("pause")
	wantCode(t, r, 0)
	var pres proto.PauseResult
	r.json(t, &pres)
	if !pres.Paused || strings.Contains(r.stdout, `"dir"`) || strings.Contains(r.stdout, `"code"`) {
		t.Errorf("one --dir: pause printed %q", r.stdout)
	}
	wantHeld(t, procs)
	r = l.verb("continue")
	wantCode(t, r, 0)
	var cres proto.ContinueResult
	r.json(t, &cres)
	if strings.Contains(r.stdout, `"dir"`) || strings.Contains(r.stdout, `"code"`) {
		t.Errorf("one --dir: continue printed %q", r.stdout)
	}
	waitRunning(t, procs)

	other := filepath.Join(t.TempDir(), "other")
	for _, verb := range []string{"pause", "continue"} {
		r := ngsup(t, append(dirArgs(verb, l.Dir, other), "--id", l.ID)...)
		wantUsageError(t, r, "--id", "--dir")
	}
	for _, d := range []string{l.Dir, other} {
		if exists(filepath.Join(d, proto.PauseFile)) {
			t.Errorf("a refused command left a pause file in %s", d)
		}
	}
	waitRunning(t, procs)
}
