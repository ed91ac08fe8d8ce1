package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// spoilProcSet puts three lines that are not records around the records of
// the bookkeeping file path: garbage and a bad start time before them, a
// 100 KiB line after them (over bufio.Scanner's 64 KiB token limit).
func spoilProcSet(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		t.Fatalf("fixture: %s holds no records", path)
	}
	var b bytes.Buffer
	b.WriteString("garbage \x00\xff line\n12 notanumber\n")
	b.Write(data)
	b.Write(bytes.Repeat([]byte("7"), 100<<10))
	b.WriteString("\n")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStopSkipsBadKnownLines proves that garbage and a 100 KiB line in the
// known set do not keep stop from working: with the supervisor gone, stop
// still ends every process, including the orphan with an empty environment
// that only the known set's good lines name, and reports the three bad
// lines it skipped.
func TestStopSkipsBadKnownLines(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach([]string{"--no-cgroup"}, helper("harness", "-daemon", "-orphan-noenv", "-setsid"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "daemon", "orphan-noenv", "setsid"} {
		procs[role] = l.role(role)
	}
	l.pause() // records the known set
	l.resume()
	spoilProcSet(t, filepath.Join(l.Dir, proto.KnownFile))
	sup := proc{l.Sup.PID, l.Sup.StartTicks}
	if err := unix.Kill(sup.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wantGone(t, map[string]proc{"supervisor": sup})
	res := l.stop("1s")
	wantGone(t, procs)
	if res.SkippedLines != 3 {
		t.Errorf("stop: skipped_lines %d, want 3", res.SkippedLines)
	}
}

// TestContinueSkipsBadPausedLines proves that garbage and a 100 KiB line in
// the paused set do not keep continue from working: every process runs
// again, continue exits 0 and reports the three bad lines it skipped.
func TestContinueSkipsBadPausedLines(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach([]string{"--no-cgroup"}, helper("harness", "-bg", "-setsid", "-daemon"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid", "daemon"} {
		procs[role] = l.role(role)
	}
	l.pause()
	wantHeld(t, procs)
	spoilProcSet(t, filepath.Join(l.Dir, proto.PausedFile))
	res := l.resume()
	waitRunning(t, procs)
	if res.SkippedLines != 3 {
		t.Errorf("continue: skipped_lines %d, want 3", res.SkippedLines)
	}
	if exists(filepath.Join(l.Dir, proto.PauseFile)) {
		t.Errorf("continue left the pause file")
	}
}
