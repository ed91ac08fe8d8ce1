package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// detached starts a process in sb that leaves the exec's session and
// outlives it (as a launch does), held by the test; paused sends it
// SIGSTOP, as a checkpoint's pause leaves a launch.
func detached(t *testing.T, sb *Sandbox, paused bool) *proc {
	t.Helper()
	tag := newTag()
	res := run(t, sb, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", `setsid sh -c 'exec sleep 300' </dev/null >/dev/null 2>&1 & echo $!`},
		Env:  map[string]string{tagVar: tag},
	})
	var pid int
	if _, err := fmt.Sscan(string(res.Stdout), &pid); err != nil {
		t.Fatalf("pid: %q", res.Stdout)
	}
	p := adopt(t, pid, tag)
	if paused {
		if err := unix.PidfdSendSignal(p.fd, unix.SIGSTOP, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// TestRemoveEndsEveryProcessFirst proves that removing a sandbox ends every
// process still running in it before its folder goes: a detached one and
// one held paused (SIGSTOP, as a checkpoint leaves a launch) are gone once
// Remove returns, and so is the folder; a process of another sandbox of the
// same backend, and one of a sandbox of the same name under another base,
// live on. Remove once deleted the folder and left them running (paused
// forever), with nothing left on disk to find them by.
func TestRemoveEndsEveryProcessFirst(t *testing.T) {
	b, other := nsBackend(t), nsBackend(t)
	sb, keep, twin := create(t, b, "rm"), create(t, b, "keep"), create(t, other, "rm")
	running, paused := detached(t, sb, false), detached(t, sb, true)
	kept, twinP := detached(t, keep, false), detached(t, twin, true)
	if err := b.Remove(context.Background(), "rm"); err != nil {
		t.Fatalf("remove: %v", err)
	}
	for name, p := range map[string]*proc{"running": running, "paused": paused} {
		if !p.waitExit(0) {
			t.Errorf("the %s process of the removed sandbox (pid %d) outlived Remove", name, p.pid)
		}
	}
	if _, err := os.Stat(b.HostPath("rm")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the removed sandbox's folder: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(b.Base(), "sandboxes", ".remove-*")); len(left) > 0 {
		t.Errorf("the removal left %q", left)
	}
	for name, p := range map[string]*proc{"another sandbox's": kept, "another base's": twinP} {
		if !p.alive() {
			t.Errorf("%s process (pid %d) was ended", name, p.pid)
		}
	}
}

// TestEndStraysEndsWhatNoSessionOwns proves what a restarted owner ends:
// every process of a sandbox of its base that keep does not accept, also of
// a sandbox whose folder was deleted while its process ran (paused, as a
// dead deployment's launch is left) and of one whose folder is named by a
// removal in progress; never one of a sandbox keep accepts, nor any of
// another base on the same host: one with a sandbox of the same id whose
// folder was deleted too, and one whose base lies inside a sandbox folder
// of the first that is ended (its paths start with that sandbox's).
func TestEndStraysEndsWhatNoSessionOwns(t *testing.T) {
	b, other := nsBackend(t), nsBackend(t)
	gone, unowned, owned := create(t, b, "gone"), create(t, b, "unowned"), create(t, b, "owned")
	removing := create(t, b, "removing")
	nested, err := New(filepath.Join(b.HostPath("unowned"), "work", "base"), Options{Isolation: IsolationNamespace, MountPoint: filepath.Join(t.TempDir(), "mnt")})
	if err != nil {
		t.Fatal(err)
	}
	otherGone, inner := create(t, other, "gone"), create(t, nested, "unowned")
	ends := map[string]*proc{
		"deleted": detached(t, gone, true), "unowned": detached(t, unowned, false), "being removed": detached(t, removing, true),
	}
	lives := map[string]*proc{
		"owned": detached(t, owned, false), "another base's deleted": detached(t, otherGone, true),
		"a nested base's": detached(t, inner, false),
	}
	for _, h := range []string{b.HostPath("gone"), other.HostPath("gone")} {
		if err := os.RemoveAll(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := renameAway(filepath.Join(b.Base(), "sandboxes"), "removing"); err != nil {
		t.Fatal(err)
	}
	n, err := b.EndStrays(context.Background(), func(id string) bool { return id == "owned" || id == "removing" })
	if err != nil {
		t.Fatalf("end strays: %v", err)
	}
	if n != len(ends) {
		t.Errorf("ended %d processes, want %d", n, len(ends))
	}
	for name, p := range ends {
		if !p.waitExit(10 * time.Second) {
			t.Errorf("the %s sandbox's process (pid %d) lives on", name, p.pid)
		}
	}
	for name, p := range lives {
		if !p.alive() {
			t.Errorf("the %s sandbox's process (pid %d) was ended", name, p.pid)
		}
	}
}

// TestClaimHoldsTheBaseForOneOwner proves that a base is held by one owner
// at a time (a starting owner ends what its base's sandboxes run, which
// must never hit a live owner's): a second claim of a held base fails with
// ErrBaseInUse naming the holder's pid, another base is free, and once the
// holder lets go the base can be claimed again.
func TestClaimHoldsTheBaseForOneOwner(t *testing.T) {
	b, other := newBackend(t, Options{Isolation: IsolationNone}), newBackend(t, Options{Isolation: IsolationNone})
	release, err := b.Claim()
	if err != nil {
		t.Fatal(err)
	}
	again, err := New(b.Base(), Options{Isolation: IsolationNone})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Claim(); !errors.Is(err, ErrBaseInUse) || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Errorf("a second claim of a held base: %v, want ErrBaseInUse naming pid %d", err, os.Getpid())
	}
	releaseOther, err := other.Claim()
	if err != nil {
		t.Errorf("another base: %v", err)
	} else {
		releaseOther()
	}
	release()
	if release2, err := again.Claim(); err != nil {
		t.Errorf("a claim after the holder let go: %v", err)
	} else {
		release2()
	}
}

// TestEndSandboxesFindsANamespaceWhoseFirstProcessChangedItsRoot proves
// that a process of a sandbox that changed its root (chroot: it no longer
// sees the sandbox's folder) neither escapes the end of its sandbox nor
// hides the rest of its namespace. The chrooted one is the first of its
// namespace a scan meets (it has the lower pid); the scan once asked only
// that one, took its "none" for the namespace's, and left both running.
func TestEndSandboxesFindsANamespaceWhoseFirstProcessChangedItsRoot(t *testing.T) {
	b := nsBackend(t)
	sb := create(t, b, "jailed")
	tag := newTag()
	// The jail holds sleep and the libraries it loads. The outer sh starts
	// a plain sleep, then becomes the chrooted one: the lower pid.
	res := run(t, sb, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", `J=` + sandbox.Quote(filepath.Join(sb.Workdir(), "jail")) + `
mkdir -p "$J" && for f in /bin/sleep $(ldd /bin/sleep | grep -o '/[^ ]*'); do cp --parents "$f" "$J" || exit 1; done
setsid sh -c 'sleep 300 & exec chroot "$0" /bin/sleep 300' "$J" </dev/null >/dev/null 2>&1 & echo $!`},
		Env: map[string]string{tagVar: tag},
	})
	var pid int
	if _, err := fmt.Sscan(string(res.Stdout), &pid); err != nil {
		t.Fatalf("pid: %q (stderr %q)", res.Stdout, res.Stderr)
	}
	jailed := adopt(t, pid, tag)
	var children []int
	testkit.Eventually(t, fmt.Sprintf("the plain sleep under %d", pid), func() (bool, string) {
		children = proctest.Children(pid)
		return len(children) > 0, fmt.Sprintf("children %v", children)
	})
	plain := adopt(t, children[0], tag)
	testkit.Eventually(t, fmt.Sprintf("process %d in its chroot", pid), func() (bool, string) {
		root, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", pid))
		return strings.HasSuffix(root, "/jail"), "root " + root
	})
	if _, err := b.EndSandboxes(context.Background(), []string{"jailed"}); err != nil {
		t.Fatalf("end the sandbox: %v", err)
	}
	for name, p := range map[string]*proc{"chrooted": jailed, "plain": plain} {
		if !p.waitExit(0) {
			t.Errorf("the %s process of the ended sandbox (pid %d) still runs", name, p.pid)
		}
	}
}
