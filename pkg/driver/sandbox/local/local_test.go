package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

func TestNewRejectsBadOptions(t *testing.T) {
	base := t.TempDir()
	for name, c := range map[string]struct {
		base string
		opt  Options
	}{
		"relative base":        {"rel/base", Options{}},
		"empty base":           {"", Options{}},
		"unknown isolation":    {base, Options{Isolation: "chroot"}},
		"relative mount point": {base, Options{MountPoint: "sandbox", Isolation: IsolationNone}},
		"bad env key":          {base, Options{Isolation: IsolationNone, Env: map[string]string{"A=B": "x"}}},
		"env key with space":   {base, Options{Isolation: IsolationNone, Env: map[string]string{"A B": "x"}}},
		"env value with NUL":   {base, Options{Isolation: IsolationNone, Env: map[string]string{"A": "x\x00y"}}},
	} {
		if _, err := New(c.base, c.opt); err == nil {
			t.Errorf("%s: New accepted %+v", name, c)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func TestNamespaceRequiredFailsWithoutRoot(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("running as root: namespace isolation is available")
	}
	_, err := New(t.TempDir(), Options{Isolation: IsolationNamespace, MountPoint: filepath.Join(t.TempDir(), "mnt")})
	if err == nil {
		t.Fatal("namespace isolation was granted without root")
	}
	b, err := New(t.TempDir(), Options{MountPoint: filepath.Join(t.TempDir(), "mnt")})
	if err != nil {
		t.Fatal(err)
	}
	if b.Isolation() != IsolationNone {
		t.Fatalf("auto without root chose %q", b.Isolation())
	}
}

func TestNamespaceMountPointMustNotOverlapBase(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: mount namespaces need root")
	}
	base := t.TempDir()
	for _, mp := range []string{base, filepath.Join(base, "sandboxes", "x"), filepath.Dir(base), "/"} {
		if _, err := New(base, Options{Isolation: IsolationNamespace, MountPoint: mp}); err == nil {
			t.Errorf("mount point %s accepted with base %s", mp, base)
		}
	}
}

func TestBadIDsRejected(t *testing.T) {
	b := newBackend(t, Options{Isolation: IsolationNone})
	ctx := context.Background()
	good := create(t, b, "good-1.A_b")
	if err := b.Snapshot(ctx, good.ID(), "snap"); err != nil {
		t.Fatal(err)
	}
	bad := []string{"", ".", "..", ".hidden", "a/b", "../escape", "/abs", "a b", "a\nb", "a;b", "$(x)", "ü", strings.Repeat("x", maxIDLen+1)}
	for _, id := range bad {
		check := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, ErrBadID) {
				t.Errorf("%s(%q): want ErrBadID, got %v", what, id, err)
			}
		}
		_, err := b.Create(ctx, id)
		check("Create", err)
		_, err = b.Connect(ctx, sandbox.Descriptor{Provider: "local", SandboxID: id})
		check("Connect", err)
		check("Snapshot sandbox", b.Snapshot(ctx, id, "s2"))
		check("Snapshot id", b.Snapshot(ctx, good.ID(), id))
		_, err = b.Fork(ctx, id, "new")
		check("Fork snapshot", err)
		_, err = b.Fork(ctx, "snap", id)
		check("Fork new id", err)
		check("Remove", b.Remove(ctx, id))
		check("RemoveSnapshot", b.RemoveSnapshot(ctx, id))
	}
	// Nothing escaped into or beside the base folder.
	entries, _ := os.ReadDir(b.Base())
	for _, e := range entries {
		if e.Name() != "sandboxes" && e.Name() != "snapshots" && e.Name() != toolsFolder {
			t.Errorf("unexpected %s in the base folder", e.Name())
		}
	}
	if _, err := b.Create(ctx, good.ID()); !errors.Is(err, ErrExists) {
		t.Errorf("Create of an existing id: want ErrExists, got %v", err)
	}
}

func TestExecBasics(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(m.name, func(t *testing.T) {
			t.Setenv("NGH_DRIVER_SECRET", "must-not-leak")
			b := newBackend(t, m.opt)
			sb := create(t, b, "basics")

			res := run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}})
			if string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.ExitCode != 7 {
				t.Errorf("got exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
			}
			if res.Duration <= 0 {
				t.Errorf("duration %v", res.Duration)
			}

			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$; sleep 5"}})
			if res.ExitCode != 128+15 {
				t.Errorf("killed by SIGTERM: exit code %d, want 143", res.ExitCode)
			}
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "kill -KILL $$"}})
			if res.ExitCode != 128+9 {
				t.Errorf("killed by SIGKILL: exit code %d, want 137", res.ExitCode)
			}

			// Environment: the base one plus req.Env, not the driver's.
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"EXTRA": "a b 'c'", "LANG": "C"}})
			env := map[string]string{}
			for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
				k, v, _ := strings.Cut(l, "=")
				env[k] = v
			}
			if env["EXTRA"] != "a b 'c'" || env["LANG"] != "C" || env["PATH"] == "" {
				t.Errorf("env: %v", env)
			}
			if env["HOME"] != filepath.Join(sb.Inside(), "home") {
				t.Errorf("HOME=%q, want %s", env["HOME"], filepath.Join(sb.Inside(), "home"))
			}
			if _, ok := env["NGH_DRIVER_SECRET"]; ok {
				t.Errorf("the driver's environment leaked into the sandbox")
			}

			// Working folder: the Workdir by default, relative dirs below it.
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"pwd"}})
			if got := strings.TrimSpace(string(res.Stdout)); got != sb.Workdir() {
				t.Errorf("default dir %q, want %q", got, sb.Workdir())
			}
			sh(t, sb, "mkdir -p sub/dir")
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"pwd"}, Dir: "sub/dir"})
			if got := strings.TrimSpace(string(res.Stdout)); got != filepath.Join(sb.Workdir(), "sub/dir") {
				t.Errorf("relative dir %q", got)
			}
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"pwd"}, Dir: sb.Root()})
			if got := strings.TrimSpace(string(res.Stdout)); got != sb.Root() {
				t.Errorf("absolute dir %q, want %q", got, sb.Root())
			}

			// Stdin.
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("from stdin")})
			if string(res.Stdout) != "from stdin" {
				t.Errorf("stdin: %q", res.Stdout)
			}
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"cat"}})
			if len(res.Stdout) != 0 || res.ExitCode != 0 {
				t.Errorf("no stdin: %q exit %d", res.Stdout, res.ExitCode)
			}

			// A command that does not exist is an exit code, not an error.
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"/no/such/program"}})
			if res.ExitCode != 127 {
				t.Errorf("missing program: exit %d", res.ExitCode)
			}

			// Bad requests are errors and run nothing.
			for _, req := range []sandbox.ExecRequest{
				{},
				{Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}},
				{Argv: []string{"true"}, Env: map[string]string{"1A": "x"}},
				{Argv: []string{"a\x00b"}},
			} {
				if _, err := sb.Exec(context.Background(), req); err == nil {
					t.Errorf("Exec(%+v) accepted", req)
				}
			}
		})
	}
}

func TestExecHostileTextArrivesIntact(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(m.name, func(t *testing.T) {
			b := newBackend(t, m.opt)
			sb := create(t, b, "hostile")
			marker := filepath.Join(t.TempDir(), "pwned")
			words := hostile(marker)
			words = append(words, strings.Repeat("$(touch "+marker+")'\"\\`", 200))

			argv := append([]string{"printf", `%s\0`}, words...)
			res := run(t, sb, sandbox.ExecRequest{Argv: argv})
			got := strings.Split(string(res.Stdout), "\x00")
			got = got[:len(got)-1]
			if len(got) != len(words) {
				t.Fatalf("got %d words, want %d", len(got), len(words))
			}
			for i := range words {
				if got[i] != words[i] {
					t.Errorf("word %d: got %q, want %q", i, got[i], words[i])
				}
			}

			// In the environment and as the working folder too.
			env := map[string]string{}
			for i, w := range words {
				env[fmt.Sprintf("V%d", i)] = w
			}
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"env", "-0"}, Env: env})
			seen := map[string]string{}
			for _, kv := range strings.Split(string(res.Stdout), "\x00") {
				k, v, _ := strings.Cut(kv, "=")
				seen[k] = v
			}
			for k, v := range env {
				if seen[k] != v {
					t.Errorf("env %s: got %q, want %q", k, seen[k], v)
				}
			}
			dirName := "d $(touch " + marker + ") ' \" ;"
			if err := os.MkdirAll(filepath.Join(sb.HostPath(), "work", dirName), 0o755); err != nil {
				t.Fatal(err)
			}
			res = run(t, sb, sandbox.ExecRequest{Argv: []string{"pwd"}, Dir: dirName})
			if got := strings.TrimSuffix(string(res.Stdout), "\n"); got != filepath.Join(sb.Workdir(), dirName) {
				t.Errorf("dir: got %q", got)
			}
			assertNoFile(t, marker)
		})
	}
}

// execWithPids runs script (which writes the pid of a process in the
// command's group to $PWD/in and of one that left it to $PWD/out, then
// blocks) and adopts both processes while the command runs. stop ends the
// exec (cancelling its context, or nothing for a timeout).
func execWithPids(t *testing.T, sb *Sandbox, ctx context.Context, timeout time.Duration, stop func()) (in, out *proc, res sandbox.ExecResult, err error) {
	t.Helper()
	tag := newTag()
	script := `sleep 300 & echo $! > in.tmp && mv in.tmp in
setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > out.tmp && mv out.tmp out
echo started; sleep 300`
	type result struct {
		res sandbox.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, e := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Env: map[string]string{tagVar: tag}, Timeout: timeout})
		done <- result{r, e}
	}()
	work := filepath.Join(sb.HostPath(), "work")
	in = adopt(t, readPid(t, filepath.Join(work, "in")), tag)
	out = adopt(t, readPid(t, filepath.Join(work, "out")), tag)
	// $! is known before the child has run setsid: until it runs sleep it
	// may still be in the command's group, and a kill of the group then
	// rightly takes it (seen in CI-20, on a loaded machine).
	testkit.Eventually(t, "the process leaving the group to run sleep", func() (bool, string) {
		st, ok := proctest.ReadStat(out.pid)
		return ok && st.Comm == "sleep", fmt.Sprintf("%+v", st)
	})
	stop()
	select {
	case r := <-done:
		return in, out, r.res, r.err
	case <-time.After(2 * time.Minute):
		t.Fatal("the exec did not end")
	}
	return
}

func TestExecTimeoutKillsExactlyItsGroup(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(m.name, func(t *testing.T) {
			b := newBackend(t, m.opt)
			sb := create(t, b, "timeout")
			in, out, res, err := execWithPids(t, sb, context.Background(), 3*time.Second, func() {})
			if !errors.Is(err, sandbox.ErrTimeout) {
				t.Fatalf("want ErrTimeout, got %v", err)
			}
			if res.ExitCode != 128+9 || !bytes.Contains(res.Stdout, []byte("started")) {
				t.Errorf("result: exit %d stdout %q", res.ExitCode, res.Stdout)
			}
			if !in.waitExit(10 * time.Second) {
				t.Errorf("the process in the command's group survived the timeout")
			}
			if !out.alive() {
				t.Errorf("the process that left the group was killed")
			}
		})
	}
}

func TestExecCancelKillsExactlyItsGroup(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(m.name, func(t *testing.T) {
			b := newBackend(t, m.opt)
			sb := create(t, b, "cancel")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			in, out, _, err := execWithPids(t, sb, ctx, time.Hour, cancel)
			if !errors.Is(err, context.Canceled) || errors.Is(err, sandbox.ErrTimeout) {
				t.Fatalf("want context.Canceled (not ErrTimeout), got %v", err)
			}
			if !in.waitExit(10 * time.Second) {
				t.Errorf("the process in the command's group survived the cancellation")
			}
			if !out.alive() {
				t.Errorf("the process that left the group was killed")
			}
			// A context that has ended runs nothing.
			if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"touch", "late"}}); !errors.Is(err, context.Canceled) {
				t.Errorf("exec with a cancelled context: %v", err)
			}
			assertNoFile(t, filepath.Join(sb.HostPath(), "work", "late"))
		})
	}
}

func TestExecReturnsWhileADetachedChildHoldsItsOutput(t *testing.T) {
	b := newBackend(t, Options{Isolation: IsolationNone})
	sb := create(t, b, "holder")
	tag := newTag()
	// The child keeps stdout and stderr open; Exec must still return (after
	// ioGrace), with the command's own output.
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{
		Argv: []string{"sh", "-c", "setsid sleep 300 & echo $! > pid; echo done"},
		Env:  map[string]string{tagVar: tag}, Timeout: time.Minute})
	adopt(t, readPid(t, filepath.Join(sb.HostPath(), "work", "pid")), tag)
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "done\n" {
		t.Fatalf("exec: %v exit %d stdout %q", err, res.ExitCode, res.Stdout)
	}
}

func TestNamespaceFolderAppearsAtMountPoint(t *testing.T) {
	b := nsBackend(t)
	sb := create(t, b, "ns")
	mp := b.MountPoint()
	if sb.Root() != filepath.Join(mp, ".ngharness") || sb.Workdir() != filepath.Join(mp, "work") {
		t.Fatalf("Root %s Workdir %s with mount point %s", sb.Root(), sb.Workdir(), mp)
	}
	sh(t, sb, "echo inside > "+sandbox.Quote(filepath.Join(mp, "work", "f")))
	got, err := os.ReadFile(filepath.Join(b.HostPath("ns"), "work", "f"))
	if err != nil || string(got) != "inside\n" {
		t.Fatalf("host folder: %q %v", got, err)
	}
	// The host's mount point stays an empty folder: the bind mount lived in
	// the command's namespace only.
	if entries, _ := os.ReadDir(mp); len(entries) != 0 {
		t.Fatalf("the host's mount point is not empty: %v", entries)
	}
	// A mount point that went missing is made again.
	if err := os.Remove(mp); err != nil {
		t.Fatal(err)
	}
	res := sh(t, sb, "cat f")
	if string(res.Stdout) != "inside\n" {
		t.Fatalf("after the mount point was removed: %q", res.Stdout)
	}
}

func TestNamespaceTwoSandboxesAtOnce(t *testing.T) {
	b := nsBackend(t)
	flag := filepath.Join(t.TempDir(), "go")
	mp := b.MountPoint()
	var wg sync.WaitGroup
	results := map[string]string{}
	var mu sync.Mutex
	for _, id := range []string{"one", "two"} {
		sb := create(t, b, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each writes its name at the mount point, waits until both are
			// running, then reads back what it sees there.
			script := fmt.Sprintf("echo %s > %s/work/who; while [ ! -e %s ]; do sleep 0.01; done; cat %s/work/who",
				id, sandbox.Quote(mp), sandbox.Quote(flag), sandbox.Quote(mp))
			res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: time.Minute})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				results[id] = err.Error()
				return
			}
			results[id] = strings.TrimSpace(string(res.Stdout))
		}()
	}
	waitFile(t, filepath.Join(b.HostPath("one"), "work", "who"))
	waitFile(t, filepath.Join(b.HostPath("two"), "work", "who"))
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if results["one"] != "one" || results["two"] != "two" {
		t.Fatalf("each sandbox should see its own folder at %s: %v", mp, results)
	}
}

func TestNamespaceKeptByBackgroundProcess(t *testing.T) {
	b := nsBackend(t)
	sb := create(t, b, "bg")
	mp := b.MountPoint()
	flag := filepath.Join(t.TempDir(), "go")
	tag := newTag()
	// The background process leaves the exec's session and group, outlives
	// the exec, and only after the exec returned reads a file the test
	// writes in the host folder, through the mount point.
	inner := fmt.Sprintf(`while [ ! -e %[1]s ]; do sleep 0.02; done
pwd > %[2]s/work/bg.cwd.tmp
cat /proc/self/mountinfo > %[2]s/work/bg.mountinfo
cat %[2]s/work/msg > %[2]s/work/seen.tmp
mv %[2]s/work/bg.cwd.tmp %[2]s/work/bg.cwd
mv %[2]s/work/seen.tmp %[2]s/work/seen
exec sleep 300`, sandbox.Quote(flag), sandbox.Quote(mp))
	res := run(t, sb, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", `setsid sh -c "$1" </dev/null >/dev/null 2>&1 & echo $!`, "sh", inner},
		Env:  map[string]string{tagVar: tag},
	})
	var pid int
	if _, err := fmt.Sscan(string(res.Stdout), &pid); err != nil {
		t.Fatalf("pid: %q", res.Stdout)
	}
	p := adopt(t, pid, tag)
	if !p.alive() {
		t.Fatal("the background process is gone")
	}
	// The exec has returned; now the test writes and lets it read.
	host := filepath.Join(b.HostPath("bg"), "work")
	if err := os.WriteFile(filepath.Join(host, "msg"), []byte("after the exec\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := waitFile(t, filepath.Join(host, "seen")); string(got) != "after the exec\n" {
		t.Fatalf("the background process read %q at %s/work/msg", got, mp)
	}
	if got := waitFile(t, filepath.Join(host, "bg.cwd")); strings.TrimSpace(string(got)) != sb.Workdir() {
		t.Errorf("background cwd %q, want %q", got, sb.Workdir())
	}
	mi, _ := os.ReadFile(filepath.Join(host, "bg.mountinfo"))
	if !bytes.Contains(mi, []byte(" "+mp+" ")) {
		t.Errorf("the background process's mountinfo has no mount at %s:\n%s", mp, mi)
	}
	// Seen from the host, too: the process's namespace still has it.
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil || !bytes.Contains(mi, []byte(" "+mp+" ")) {
		t.Errorf("/proc/%d/mountinfo has no mount at %s (%v)", pid, mp, err)
	}
}

func TestSnapshotAndFork(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(m.name, func(t *testing.T) {
			ctx := context.Background()
			b := newBackend(t, m.opt)
			orig := create(t, b, "orig")
			sh(t, orig, "echo original > a; mkdir -p d/e; echo deep > d/e/f; chmod 750 d/e/f; ln -s d/e/f link; mkfifo fifo")
			if err := orig.Upload(ctx, filepath.Join(orig.Root(), "state", "s"), []byte("harness state"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := b.Snapshot(ctx, "orig", "snap-1"); err != nil {
				t.Fatal(err)
			}
			if !b.HasSnapshot("snap-1") {
				t.Fatal("HasSnapshot: no")
			}
			if err := b.Snapshot(ctx, "orig", "snap-1"); !errors.Is(err, ErrExists) {
				t.Errorf("second snapshot under the same id: want ErrExists, got %v", err)
			}
			// Changing the original after the snapshot changes neither.
			sh(t, orig, "echo changed > a")

			fork, err := b.Fork(ctx, "snap-1", "fork")
			if err != nil {
				t.Fatal(err)
			}
			if fork.Workdir() != strings.Replace(orig.Workdir(), "orig", "fork", 1) && m.name == "none" {
				t.Errorf("fork workdir %s", fork.Workdir())
			}
			if m.name == "namespace" && (fork.Workdir() != orig.Workdir() || fork.Root() != orig.Root()) {
				t.Errorf("the fork's paths differ: %s %s vs %s %s", fork.Workdir(), fork.Root(), orig.Workdir(), orig.Root())
			}
			res := sh(t, fork, "cat a d/e/f link; stat -c %a d/e/f; test -p fifo && echo fifo; cat "+sandbox.Quote(filepath.Join(fork.Root(), "state", "s")))
			if want := "original\ndeep\ndeep\n750\nfifo\nharness state"; string(res.Stdout) != want {
				t.Errorf("fork sees %q, want %q", res.Stdout, want)
			}
			sh(t, fork, "echo forked > a; echo new > g")
			if res := sh(t, orig, "cat a; test -e g || echo no-g"); string(res.Stdout) != "changed\nno-g\n" {
				t.Errorf("writing in the fork changed the original: %q", res.Stdout)
			}
			if _, err := b.Fork(ctx, "snap-1", "fork"); !errors.Is(err, ErrExists) {
				t.Errorf("fork onto an existing sandbox: want ErrExists, got %v", err)
			}
			if _, err := b.Fork(ctx, "no-such-snap", "fork2"); !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("fork of a missing snapshot: want ErrNotFound, got %v", err)
			}
			if err := b.Snapshot(ctx, "no-such-sandbox", "snap-2"); !errors.Is(err, sandbox.ErrGone) {
				t.Errorf("snapshot of a missing sandbox: want ErrGone, got %v", err)
			}

			// Removal: gone at once, idempotent, no temporary names left.
			if err := b.RemoveSnapshot(ctx, "snap-1"); err != nil {
				t.Fatal(err)
			}
			if b.HasSnapshot("snap-1") {
				t.Error("the snapshot survived RemoveSnapshot")
			}
			if err := b.RemoveSnapshot(ctx, "snap-1"); err != nil {
				t.Errorf("second RemoveSnapshot: %v", err)
			}
			if err := b.Remove(ctx, "orig"); err != nil {
				t.Fatal(err)
			}
			if err := b.Remove(ctx, "orig"); err != nil {
				t.Errorf("second Remove: %v", err)
			}
			if _, err := b.Connect(ctx, sandbox.Descriptor{Provider: "local", SandboxID: "orig"}); !errors.Is(err, sandbox.ErrGone) {
				t.Errorf("connect to a removed sandbox: want ErrGone, got %v", err)
			}
			if _, err := orig.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrGone) {
				t.Errorf("exec in a removed sandbox: want ErrGone, got %v", err)
			}
			for _, d := range []string{"sandboxes", "snapshots"} {
				entries, _ := os.ReadDir(filepath.Join(b.Base(), d))
				for _, e := range entries {
					if strings.HasPrefix(e.Name(), ".") {
						t.Errorf("leftover %s/%s", d, e.Name())
					}
				}
			}
		})
	}
}

func TestUpload(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(m.name, func(t *testing.T) {
			ctx := context.Background()
			b := newBackend(t, m.opt)
			sb := create(t, b, "up")
			in := sb.Inside()

			p := filepath.Join(sb.Root(), "bin", "deep", "tool")
			if err := sb.Upload(ctx, p, []byte("#!/bin/sh\necho tool ran\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			res := run(t, sb, sandbox.ExecRequest{Argv: []string{p}})
			if string(res.Stdout) != "tool ran\n" {
				t.Errorf("uploaded tool: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
			}
			host := filepath.Join(sb.HostPath(), ".ngharness", "bin", "deep", "tool")
			if fi, err := os.Stat(host); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("host file %s: %v %v", host, fi, err)
			}
			// Replace, with another mode.
			if err := sb.Upload(ctx, p, []byte("secret"), 0o600); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(host); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("replaced file: %v %v", fi, err)
			}
			if got, _ := os.ReadFile(host); string(got) != "secret" {
				t.Errorf("replaced content %q", got)
			}
			// Right below the sandbox's folder, and HostPathOf agrees.
			top := filepath.Join(in, "top-level")
			if err := sb.Upload(ctx, top, []byte("top"), 0o640); err != nil {
				t.Fatal(err)
			}
			if hp, err := sb.HostPathOf(top); err != nil || hp != filepath.Join(sb.HostPath(), "top-level") {
				t.Errorf("HostPathOf(%s) = %s, %v", top, hp, err)
			} else if got, _ := os.ReadFile(hp); string(got) != "top" {
				t.Errorf("top-level upload: %q", got)
			}
			if _, err := sb.HostPathOf("/elsewhere"); err == nil {
				t.Error("HostPathOf accepted a path outside the sandbox")
			}
			// A relative symlink that stays inside is followed.
			sh(t, sb, "mkdir -p real && ln -s real alias")
			if err := sb.Upload(ctx, filepath.Join(sb.Workdir(), "alias", "x"), []byte("via link"), 0o644); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(filepath.Join(sb.HostPath(), "work", "real", "x")); string(got) != "via link" {
				t.Errorf("through the relative symlink: %q", got)
			}

			outside := t.TempDir()
			if err := os.Symlink(outside, filepath.Join(sb.HostPath(), "work", "abs")); err != nil {
				t.Fatal(err)
			}
			sh(t, sb, "ln -s ../../../../../../../../.. up")
			for _, bad := range []string{
				"relative/path",
				"",
				in,
				in + "/",
				in + "x/file",
				filepath.Dir(in) + "/elsewhere",
				in + "/../escape",
				"/etc/ngh-should-not-exist",
				filepath.Join(sb.Workdir(), "abs", "file"),
				filepath.Join(sb.Workdir(), "up", "tmp", "ngh-escape"),
				filepath.Join(sb.Workdir(), "a\x00b"),
			} {
				if err := sb.Upload(ctx, bad, []byte("x"), 0o644); err == nil {
					t.Errorf("Upload(%q) accepted", bad)
				} else {
					t.Logf("Upload(%q): %v", bad, err)
				}
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Errorf("an upload landed outside the sandbox: %v", entries)
			}
			assertNoFile(t, "/tmp/ngh-escape")
			// No temporary files are left behind.
			filepath.WalkDir(sb.HostPath(), func(q string, d os.DirEntry, err error) error {
				if err == nil && strings.HasPrefix(d.Name(), ".upload-") {
					t.Errorf("leftover %s", q)
				}
				return nil
			})
		})
	}
}

func TestIsolationNone(t *testing.T) {
	b := newBackend(t, Options{Isolation: IsolationNone, Env: map[string]string{"EXTRA": "1"}})
	if b.Isolation() != IsolationNone || b.MountPoint() != "" {
		t.Fatalf("isolation %q mount point %q", b.Isolation(), b.MountPoint())
	}
	sb := create(t, b, "plain")
	host := b.HostPath("plain")
	if sb.Workdir() != filepath.Join(host, "work") || sb.Root() != filepath.Join(host, ".ngharness") {
		t.Fatalf("Workdir %s Root %s, host folder %s", sb.Workdir(), sb.Root(), host)
	}
	res := sh(t, sb, `pwd; echo "$HOME"; echo "$EXTRA"; echo "$LANG"`)
	want := fmt.Sprintf("%s\n%s\n1\nC.UTF-8\n", filepath.Join(host, "work"), filepath.Join(host, "home"))
	if string(res.Stdout) != want {
		t.Fatalf("got %q, want %q", res.Stdout, want)
	}
	for _, d := range []string{"work", "home", ".ngharness"} {
		if fi, err := os.Stat(filepath.Join(host, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", d, err)
		}
	}
}

func TestConnect(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, Options{Isolation: IsolationNone})
	sb := create(t, b, "c1")
	got, err := b.Connect(ctx, sandbox.Descriptor{Provider: "local", SandboxID: "c1", Workdir: sb.Workdir()})
	if err != nil {
		t.Fatal(err)
	}
	if got.ID() != "c1" || got.Workdir() != sb.Workdir() || got.Root() != sb.Root() {
		t.Errorf("connected %s %s %s", got.ID(), got.Workdir(), got.Root())
	}
	sub, err := b.Connect(ctx, sandbox.Descriptor{SandboxID: "c1", Workdir: filepath.Join(sb.Workdir(), "sub")})
	if err != nil || sub.Workdir() != filepath.Join(sb.Workdir(), "sub") {
		t.Errorf("descriptor workdir: %v %v", sub, err)
	}
	if _, err := b.Connect(ctx, sandbox.Descriptor{Provider: "docker", SandboxID: "c1"}); err == nil {
		t.Error("another provider's descriptor accepted")
	}
	if _, err := b.Connect(ctx, sandbox.Descriptor{Provider: "local", SandboxID: "c1", Workdir: "rel"}); err == nil {
		t.Error("a relative workdir accepted")
	}
	if _, err := b.Connect(ctx, sandbox.Descriptor{Provider: "local", SandboxID: "missing"}); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("missing sandbox: want ErrGone, got %v", err)
	}
	if b.Name() != "local" {
		t.Errorf("Name %q", b.Name())
	}
}

func TestExecTooLongCommandLineIsAClearError(t *testing.T) {
	b := newBackend(t, Options{Isolation: IsolationNone})
	sb := create(t, b, "long")
	_, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"echo", strings.Repeat("'", 40000)}})
	if err == nil || !strings.Contains(err.Error(), "Stdin or Upload") {
		t.Fatalf("want a clear error, got %v", err)
	}
}
