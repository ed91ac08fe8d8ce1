// Package sandboxtest is the conformance suite every sandbox backend that
// can also lend sandboxes passes (local, opensandbox, docker, kubectl):
// exec semantics (argv, environment, folder, exit codes, stdin, nothing of
// the task text executed), the timeout enforced in the sandbox, uploads,
// the lifecycle an owner uses, and the error classes of a sandbox that is
// gone or a service that cannot be reached.
package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Fixture is a backend under test. Its sandboxes keep their Root and
// Workdir below MountPoint, which is where each sandbox's host folder
// appears inside it.
type Fixture struct {
	// Lender makes, snapshots, forks and removes sandboxes.
	Lender sandbox.Lender
	// Backend connects to them as the driver does.
	Backend sandbox.Backend
	// HostFolder is the folder on this machine a sandbox's MountPoint is
	// (nil: this machine cannot see the sandboxes, as with a real remote
	// service; the suite then looks at files through the sandbox's own
	// exec, and at processes by their command lines there).
	HostFolder func(id string) string
	// MountPoint is where the host folder appears inside every sandbox.
	MountPoint string
	// Delete removes a sandbox behind the backend's back, as its service
	// would (nil: that test is skipped).
	Delete func(id string) error
	// Down makes the service unreachable and returns the function that
	// makes it reachable again (nil: that test is skipped).
	Down func() (up func())
}

// Run runs the suite as subtests of t.
func Run(t *testing.T, f Fixture) {
	t.Run("exec", func(t *testing.T) { t.Parallel(); testExec(t, f) })
	t.Run("timeout", func(t *testing.T) { t.Parallel(); testTimeout(t, f) })
	t.Run("cancel", func(t *testing.T) { t.Parallel(); testCancel(t, f) })
	t.Run("upload", func(t *testing.T) { t.Parallel(); testUpload(t, f) })
	t.Run("lifecycle", func(t *testing.T) { t.Parallel(); testLifecycle(t, f) })
	t.Run("deleted", func(t *testing.T) { t.Parallel(); testDeleted(t, f) })
	if f.Down != nil {
		t.Run("unreachable", func(t *testing.T) { testUnreachable(t, f) })
	}
}

func create(t *testing.T, f Fixture, name string) sandbox.Sandbox {
	t.Helper()
	sb, err := f.Lender.Create(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.Lender.Remove(context.Background(), sb.ID())
	})
	// Connect as the driver does.
	c, err := f.Backend.Connect(context.Background(), sandbox.Descriptor{Provider: f.Backend.Name(), SandboxID: sb.ID(), Workdir: sb.Workdir()})
	if err != nil {
		t.Fatal(err)
	}
	if c.ID() != sb.ID() || c.Root() != sb.Root() || c.Workdir() != sb.Workdir() {
		t.Fatalf("connected %s %s %s, lent %s %s %s", c.ID(), c.Root(), c.Workdir(), sb.ID(), sb.Root(), sb.Workdir())
	}
	return c
}

// Host maps a path inside the sandbox to this machine.
func Host(t *testing.T, f Fixture, sb sandbox.Sandbox, inside string) string {
	t.Helper()
	rel, ok := strings.CutPrefix(inside, f.MountPoint+"/")
	if !ok {
		t.Fatalf("%s is not below the mount point %s", inside, f.MountPoint)
	}
	return filepath.Join(f.HostFolder(sb.ID()), rel)
}

func run(t *testing.T, sb sandbox.Sandbox, req sandbox.ExecRequest) sandbox.ExecResult {
	t.Helper()
	res, err := sb.Exec(context.Background(), req)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", req.Argv, sb.ID(), err)
	}
	return res
}

// Hostile is task text that would run commands if any layer let a shell
// read it unquoted: each would create marker.
func Hostile(marker string) string {
	return fmt.Sprintf("$(touch %s) `touch %s` ' \" ; touch %s; exit 9\nnext line \\\" $HOME %%s", marker, marker, marker)
}

func testExec(t *testing.T, f Fixture) {
	sb := create(t, f, "sbt-exec")
	marker := filepath.Join(t.TempDir(), "pwned")
	if f.HostFolder == nil {
		marker = sb.Workdir() + "/pwned"
	}
	hostile := Hostile(marker)
	res := run(t, sb, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", `printf '%s|%s|%s' "$1" "$V" "$(pwd)"; echo err >&2; exit 3`, "sh", hostile},
		Env:  map[string]string{"V": hostile},
	})
	want := hostile + "|" + hostile + "|" + sb.Workdir()
	if res.ExitCode != 3 || string(res.Stdout) != want || string(res.Stderr) != "err\n" {
		t.Errorf("got exit %d stdout %q stderr %q, want 3 %q \"err\\n\"", res.ExitCode, res.Stdout, res.Stderr, want)
	}
	if exists(t, f, sb, marker) {
		t.Fatalf("the task text ran a command: %s exists", marker)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "cat; pwd"}, Stdin: strings.NewReader("from stdin\n"), Dir: "/tmp"})
	if res.ExitCode != 0 || string(res.Stdout) != "from stdin\n/tmp\n" {
		t.Errorf("stdin and dir: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "printf partial >&2; kill -TERM $$"}})
	if res.ExitCode != 128+15 || string(res.Stderr) != "partial" {
		t.Errorf("a command killed by SIGTERM: exit %d stderr %q, want 143 \"partial\"", res.ExitCode, res.Stderr)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"no-such-command-ngh"}})
	if res.ExitCode != 127 {
		t.Errorf("a missing command exited %d, want 127", res.ExitCode)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"pwd"}, Dir: "missing-sub"})
	if res.ExitCode == 0 {
		t.Errorf("cd into a missing folder succeeded: %q", res.Stdout)
	}
	if _, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A B": "x"}}); err == nil {
		t.Errorf("an environment key with a space was accepted")
	}
	if _, err := sb.Exec(context.Background(), sandbox.ExecRequest{}); err == nil {
		t.Errorf("an empty argv was accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"touch", "late"}}); !errors.Is(err, context.Canceled) {
		t.Errorf("exec with a cancelled context: %v", err)
	}
	if exists(t, f, sb, sb.Workdir()+"/late") {
		t.Errorf("a cancelled exec ran")
	}
}

func testTimeout(t *testing.T, f Fixture) {
	sb := create(t, f, "sbt-timeout")
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo started; exec sleep 300"}, Timeout: time.Second})
	if !errors.Is(err, sandbox.ErrTimeout) || !strings.Contains(err.Error(), sb.ID()) {
		t.Fatalf("want ErrTimeout naming %s, got %v", sb.ID(), err)
	}
	if !strings.Contains(string(res.Stdout), "started") {
		t.Errorf("the output before the timeout was lost: %q", res.Stdout)
	}
	waitProcs(t, f, sb, 0)
}

// testCancel: a command whose context ends is ended in the sandbox too
// (what it left running in a session of its own is not touched). The
// command waits until its child is in that session before it says it
// started, so the cancel never meets a child still in its group.
func testCancel(t *testing.T, f Fixture) {
	sb := create(t, f, "sbt-cancel")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "setsid sh -c 'touch sid; exec sleep 300' </dev/null >/dev/null 2>&1 & echo $! > left; until [ -e sid ]; do sleep 0.01; done; touch started; exec sleep 300"}})
		done <- err
	}()
	waitFile(t, f, sb, sb.Workdir()+"/started")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled exec returned %v", err)
	}
	// Only the process that left the command's group is left.
	waitProcs(t, f, sb, 1)
	run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "kill -KILL $(cat left)"}})
	waitProcs(t, f, sb, 0)
}

// exists reports whether the file exists in the sandbox.
func exists(t *testing.T, f Fixture, sb sandbox.Sandbox, inside string) bool {
	t.Helper()
	if f.HostFolder != nil && strings.HasPrefix(inside, f.MountPoint+"/") {
		_, err := os.Stat(Host(t, f, sb, inside))
		return err == nil
	}
	if f.HostFolder != nil {
		_, err := os.Stat(inside)
		return err == nil
	}
	return run(t, sb, sandbox.ExecRequest{Argv: []string{"test", "-e", inside}, Dir: "/"}).ExitCode == 0
}

// waitFile waits until the file exists in the sandbox.
func waitFile(t *testing.T, f Fixture, sb sandbox.Sandbox, inside string) {
	t.Helper()
	testkit.Eventually(t, inside+" in "+sb.ID(), func() (bool, string) {
		return exists(t, f, sb, inside), "missing"
	})
}

// readFile reads a file of the sandbox, with its permission bits.
func readFile(t *testing.T, f Fixture, sb sandbox.Sandbox, inside string) ([]byte, os.FileMode, error) {
	t.Helper()
	if f.HostFolder != nil {
		host := Host(t, f, sb, inside)
		data, err := os.ReadFile(host)
		if err != nil {
			return nil, 0, err
		}
		fi, err := os.Stat(host)
		if err != nil {
			return nil, 0, err
		}
		return data, fi.Mode().Perm(), nil
	}
	res := run(t, sb, sandbox.ExecRequest{Argv: []string{"stat", "-c", "%a", inside}, Dir: "/"})
	var mode uint32
	if _, err := fmt.Sscanf(string(res.Stdout), "%o", &mode); res.ExitCode != 0 || err != nil {
		return nil, 0, fmt.Errorf("stat %s: exit %d %q", inside, res.ExitCode, res.Stderr)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"cat", "--", inside}, Dir: "/"})
	if res.ExitCode != 0 {
		return nil, 0, fmt.Errorf("cat %s: exit %d %q", inside, res.ExitCode, res.Stderr)
	}
	return res.Stdout, os.FileMode(mode), nil
}

// listDir lists a folder of the sandbox.
func listDir(t *testing.T, f Fixture, sb sandbox.Sandbox, inside string) []string {
	t.Helper()
	if f.HostFolder != nil {
		ents, _ := os.ReadDir(Host(t, f, sb, inside))
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	res := run(t, sb, sandbox.ExecRequest{Argv: []string{"ls", "-A", "--", inside}, Dir: "/"})
	return strings.Fields(string(res.Stdout))
}

// waitProcs waits until n processes run in the sandbox; in a sandbox this
// machine cannot see (HostFolder nil), n of the suite's test commands,
// which are all `sleep 300`. The test fails naming them.
func waitProcs(t *testing.T, f Fixture, sb sandbox.Sandbox, n int) {
	t.Helper()
	testkit.Eventually(t, fmt.Sprintf("%d processes left in %s", n, sb.ID()), func() (bool, string) {
		var left []string
		if f.HostFolder != nil {
			for _, p := range fakeexecd.ProcsIn(f.HostFolder(sb.ID()), f.MountPoint) {
				left = append(left, proctest.Describe(p))
			}
		} else {
			script := `for p in /proc/[0-9]*; do if [ "$(tr '\000' ' ' <$p/cmdline 2>/dev/null)" = 'sleep 300 ' ]; then echo "${p#/proc/}"; fi; done`
			res := run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Dir: "/"})
			left = strings.Fields(string(res.Stdout))
		}
		return len(left) == n, fmt.Sprintf("left: %v", left)
	})
}

// WaitNoProcs waits until no process runs in the sandbox whose host
// folder is given; the test fails naming them.
func WaitNoProcs(t testing.TB, hostFolder, mountPoint string) {
	t.Helper()
	testkit.Eventually(t, "no process left in "+hostFolder, func() (bool, string) {
		var d []string
		for _, p := range fakeexecd.ProcsIn(hostFolder, mountPoint) {
			d = append(d, proctest.Describe(p))
		}
		return len(d) == 0, fmt.Sprintf("left: %v", d)
	})
}

func testUpload(t *testing.T, f Fixture) {
	sb := create(t, f, "sbt-upload")
	p := sb.Root() + "/bin/deep er/tool"
	if err := sb.Upload(context.Background(), p, []byte("#!/bin/sh\necho tool \"$@\"\n"), 0o750); err != nil {
		t.Fatal(err)
	}
	if _, mode, err := readFile(t, f, sb, p); err != nil || mode != 0o750 {
		t.Fatalf("uploaded file: mode %v %v", mode, err)
	}
	if res := run(t, sb, sandbox.ExecRequest{Argv: []string{p, "a b"}}); string(res.Stdout) != "tool a b\n" {
		t.Errorf("the uploaded tool printed %q (stderr %q)", res.Stdout, res.Stderr)
	}
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if err := sb.Upload(context.Background(), p, big, 0o644); err != nil {
		t.Fatal(err)
	}
	got, mode, err := readFile(t, f, sb, p)
	if err != nil || string(got) != string(big) {
		t.Errorf("the replaced file holds %d bytes (%v), want the %d uploaded", len(got), err, len(big))
	}
	if mode != 0o644 {
		t.Errorf("the replaced file's mode: %v", mode)
	}
	ents := listDir(t, f, sb, path.Dir(p))
	if len(ents) != 1 {
		t.Errorf("the uploads left temporary files: %v", ents)
	}
	if err := sb.Upload(context.Background(), "relative/path", []byte("x"), 0o644); err == nil {
		t.Errorf("a relative upload path was accepted")
	}
}

// testLifecycle: create, snapshot, fork, open, remove. Every snapshot it
// takes is removed again: a second snapshot of a name is a snapshot of its
// own on some services (OpenSandbox keeps the first), and a snapshot a
// fork still uses may be refused (sandbox.ErrSnapshotInUse) until the fork
// is gone.
func testLifecycle(t *testing.T, f Fixture) {
	ctx := context.Background()
	sb := create(t, f, "sbt-origin")
	run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo kept > file && mkdir -p \"$0\" && echo root > \"$0/r\"", sb.Root() + "/state"}})
	first, err := f.Lender.Snapshot(ctx, sb.ID(), "sbt-snap-1")
	if err != nil {
		t.Fatal(err)
	}
	// A second snapshot of the same name: the fork is made from it.
	run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo kept2 > file"}})
	snap, err := f.Lender.Snapshot(ctx, sb.ID(), "sbt-snap-1")
	if err != nil {
		t.Fatal(err)
	}
	fork, err := f.Lender.Fork(ctx, snap, "sbt-fork")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Lender.Remove(context.Background(), fork.ID()) })
	if fork.ID() == sb.ID() || fork.Root() != sb.Root() || fork.Workdir() != sb.Workdir() {
		t.Fatalf("fork %s (%s %s) of %s (%s %s): want a new id at the same paths", fork.ID(), fork.Root(), fork.Workdir(), sb.ID(), sb.Root(), sb.Workdir())
	}
	res := run(t, fork, sandbox.ExecRequest{Argv: []string{"sh", "-c", "cat file \"$0/r\"", sb.Root() + "/state"}})
	if string(res.Stdout) != "kept2\nroot\n" {
		t.Errorf("the fork's files: %q %q", res.Stdout, res.Stderr)
	}
	if o, err := f.Lender.Open(ctx, fork.ID()); err != nil || o.ID() != fork.ID() {
		t.Errorf("open the fork: %v", err)
	}
	if err := f.Lender.Remove(ctx, sb.ID()); err != nil {
		t.Fatal(err)
	}
	if err := f.Lender.Remove(ctx, sb.ID()); err != nil {
		t.Errorf("removing a removed sandbox: %v", err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrGone) || !strings.Contains(err.Error(), sb.ID()) {
		t.Errorf("exec in a removed sandbox: %v, want ErrGone naming %s", err, sb.ID())
	}
	if err := sb.Upload(ctx, sb.Workdir()+"/x", []byte("x"), 0o644); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("upload to a removed sandbox: %v", err)
	}
	if _, err := f.Lender.Open(ctx, sb.ID()); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("open a removed sandbox: %v", err)
	}
	// No sandbox uses the first snapshot (where it is not the second
	// one: a service may replace a snapshot of the same name).
	if err := f.Lender.RemoveSnapshot(ctx, first); err != nil {
		t.Fatalf("remove a snapshot no sandbox uses: %v", err)
	}
	// The fork's snapshot goes at once, or stays until the fork is gone.
	err = f.Lender.RemoveSnapshot(ctx, snap)
	inUse := errors.Is(err, sandbox.ErrSnapshotInUse)
	if err != nil && !inUse {
		t.Fatal(err)
	}
	// The fork does not depend on its snapshot's removal.
	run(t, fork, sandbox.ExecRequest{Argv: []string{"test", "-f", "file"}})
	if inUse {
		if err := f.Lender.Remove(ctx, fork.ID()); err != nil {
			t.Fatal(err)
		}
		if err := f.Lender.RemoveSnapshot(ctx, snap); err != nil {
			t.Fatalf("remove a snapshot once the fork that used it is gone: %v", err)
		}
	}
	if err := f.Lender.RemoveSnapshot(ctx, snap); err != nil {
		t.Errorf("removing a removed snapshot: %v", err)
	}
	if late, err := f.Lender.Fork(ctx, snap, "sbt-late"); err == nil {
		_ = f.Lender.Remove(ctx, late.ID())
		t.Errorf("a fork of a removed snapshot succeeded")
	}
}

func testDeleted(t *testing.T, f Fixture) {
	if f.Delete == nil {
		t.Skip("the fixture cannot delete a sandbox behind the backend's back")
	}
	sb := create(t, f, "sbt-deleted")
	var wg sync.WaitGroup
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err = sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sh", "-c", "touch started; exec sleep 300"}})
	}()
	waitFile(t, f, sb, sb.Workdir()+"/started")
	if derr := f.Delete(sb.ID()); derr != nil {
		t.Fatal(derr)
	}
	wg.Wait()
	if !errors.Is(err, sandbox.ErrGone) || !strings.Contains(err.Error(), sb.ID()) {
		t.Errorf("a command whose sandbox was deleted under it: %v, want ErrGone naming %s", err, sb.ID())
	}
	if _, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("exec in the deleted sandbox: %v", err)
	}
}

func testUnreachable(t *testing.T, f Fixture) {
	sb := create(t, f, "sbt-unreachable")
	up := f.Down()
	_, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"true"}})
	up()
	if !errors.Is(err, sandbox.ErrTransport) || errors.Is(err, sandbox.ErrGone) {
		t.Errorf("exec with the service unreachable: %v, want ErrTransport", err)
	}
	run(t, sb, sandbox.ExecRequest{Argv: []string{"true"}})
}
