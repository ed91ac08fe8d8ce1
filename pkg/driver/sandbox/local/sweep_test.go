package local

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
)

// sweepHelperEnv makes the test binary, re-run by TestSweepLeavesACopyInProgressAndRemovesOneAKilledProcessLeft,
// act as an owner that snapshots a sandbox: it makes a backend on
// $NGH_SWEEP_BASE and snapshots sandbox "sb" as "ck-1", and once the copy
// is made (before it is renamed into place) it creates $NGH_SWEEP_MARKER
// and blocks, so the process is killed with its copy made but not yet
// renamed into place.
const sweepHelperEnv = "NGH_SWEEP_HELPER"

func TestSweepHelperProcess(t *testing.T) {
	if os.Getenv(sweepHelperEnv) != "1" {
		t.Skip("helper process for the sweep test")
	}
	b, err := New(os.Getenv("NGH_SWEEP_BASE"), Options{Isolation: IsolationNone})
	if err != nil {
		os.Exit(3)
	}
	copiedHook = func(string) {
		if err := os.WriteFile(os.Getenv("NGH_SWEEP_MARKER"), nil, 0o644); err != nil {
			os.Exit(5)
		}
		select {}
	}
	if err := b.Snapshot(context.Background(), "sb", "ck-1"); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(4)
	}
	os.Exit(0)
}

// TestSweepLeavesACopyInProgressAndRemovesOneAKilledProcessLeft: an owner
// process killed with SIGKILL in the middle of a snapshot leaves
// base/snapshots/.copy-ck-1-<suffix>. While the copy is in progress a
// Sweep leaves it alone (its folder is locked by the process copying into
// it); once the process group is gone the next Sweep removes it, and a
// folder a killed removal left, but nothing else: not a finished
// snapshot, not a name of another shape, not a file, not a sandbox.
func TestSweepLeavesACopyInProgressAndRemovesOneAKilledProcessLeft(t *testing.T) {
	base := t.TempDir()
	b, err := New(base, Options{Isolation: IsolationNone})
	if err != nil {
		t.Fatal(err)
	}
	sb := create(t, b, "sb")
	if err := os.WriteFile(filepath.Join(sb.HostPath(), WorkFolder, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.Snapshot(context.Background(), "sb", "kept"); err != nil {
		t.Fatal(err)
	}
	snaps, boxes := filepath.Join(base, "snapshots"), filepath.Join(base, "sandboxes")
	// Not ours to sweep: other shapes, a file, an unfinished Create.
	others := []string{
		filepath.Join(snaps, ".copy-foo"),
		filepath.Join(snaps, ".copy-x-ABCDEF012345"),
		filepath.Join(snaps, ".copy--0123456789ab"),
		filepath.Join(boxes, ".new-sb2-12345"),
		filepath.Join(base, ".copy-y-0123456789ab"),
	}
	for _, p := range others {
		if err := os.MkdirAll(filepath.Join(p, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(snaps, ".copy-z-0123456789ab")
	if err := os.WriteFile(file, []byte("a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	others = append(others, file)
	// A removal killed half way.
	halfRemoved := filepath.Join(boxes, ".remove-sb-old-0123456789ab")
	if err := os.MkdirAll(filepath.Join(halfRemoved, "work"), 0o755); err != nil {
		t.Fatal(err)
	}

	marker := filepath.Join(t.TempDir(), "copied")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run", "^TestSweepHelperProcess$")
	cmd.Env = append(os.Environ(), sweepHelperEnv+"=1", "NGH_SWEEP_BASE="+base, "NGH_SWEEP_MARKER="+marker)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	// killGroup ends the helper's process group and waits until every one of them is gone.
	killGroup := func() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
		for deadline := time.Now().Add(30 * time.Second); syscall.Kill(-pgid, 0) == nil; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("process group %d outlived SIGKILL", pgid)
			}
		}
	}
	t.Cleanup(killGroup)
	testkit.Eventually(t, "the helper's copy", func() (bool, string) {
		_, err := os.Stat(marker)
		if err == nil {
			return true, ""
		}
		select {
		case <-done:
			t.Fatalf("the helper ended (%v) before its copy was made", waitErr)
		default:
		}
		return false, err.Error()
	})
	copies, _ := filepath.Glob(filepath.Join(snaps, ".copy-ck-1-*"))
	if len(copies) != 1 {
		t.Fatalf("temporary copies of ck-1: %v, want one", copies)
	}

	// The copy is in progress: a sweep leaves it, and removes the folder a
	// killed removal left.
	removed, err := b.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{halfRemoved}) {
		t.Fatalf("a sweep during the copy removed %v, want only %s", removed, halfRemoved)
	}
	if _, err := os.Stat(copies[0]); err != nil {
		t.Fatalf("a sweep removed the copy in progress: %v", err)
	}

	killGroup()
	removed, err = b.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, copies) {
		t.Fatalf("the sweep after the kill removed %v, want %v", removed, copies)
	}
	for _, p := range append(others, b.SnapshotPath("kept"), sb.HostPath()) {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("the sweep removed %s: %v", p, err)
		}
	}
	for _, p := range append(copies, halfRemoved, b.SnapshotPath("ck-1")) {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there (%v)", p, err)
		}
	}
	// A snapshot made after the sweep is whole.
	if err := b.Snapshot(context.Background(), "sb", "ck-1"); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(b.SnapshotPath("ck-1"), WorkFolder, "f")); err != nil || string(data) != "data" {
		t.Fatalf("the snapshot after the sweep holds %q, %v", data, err)
	}
}
