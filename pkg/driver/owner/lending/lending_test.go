package lending

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/syncbuf"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
	"github.com/ngharness/ngharness/pkg/gym"
)

// fixture is an owner on a fresh backend (namespace isolation when running
// as root, none otherwise) whose StopSandbox records the sandboxes it
// stopped and kills the test process whose pid a test left in the
// sandbox's .ngharness/test.pid (held by a pidfd, checked by its tag).
type fixture struct {
	t       *testing.T
	b       *local.Backend
	o       *Owner
	ctl     *gym.Control // the owner's checkpoint control plane, made by control()
	tag     string
	mu      sync.Mutex
	stopped []string
}

const tagVar = "NGH_LOCALOWNER_TEST_TAG"

func newFixture(t *testing.T, opt Options) *fixture {
	t.Helper()
	bopt := local.Options{Isolation: local.IsolationNone}
	if os.Geteuid() == 0 {
		bopt = local.Options{Isolation: local.IsolationNamespace, MountPoint: filepath.Join(t.TempDir(), "mnt")}
	} else {
		t.Log("not root: the owner runs on a backend without namespace isolation")
	}
	b, err := local.New(t.TempDir(), bopt)
	if err != nil {
		t.Fatal(err)
	}
	var tb [8]byte
	_, _ = rand.Read(tb[:])
	f := &fixture{t: t, b: b, tag: hex.EncodeToString(tb[:])}
	opt.Backend = b
	opt.StopSandbox = f.stop
	opt.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	f.o = New(opt)
	return f
}

// testWriter sends the owner's log to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (f *fixture) stop(ctx context.Context, sb sandbox.Sandbox) error {
	f.mu.Lock()
	f.stopped = append(f.stopped, sb.ID())
	f.mu.Unlock()
	b, err := os.ReadFile(filepath.Join(f.b.HostPath(sb.ID()), ".ngharness", "test.pid"))
	if err != nil {
		return nil // nothing of the test's runs there
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return err
	}
	p, err := open(pid, f.tag)
	if err != nil {
		return nil // already gone
	}
	defer unix.Close(p)
	_ = unix.PidfdSendSignal(p, unix.SIGKILL, nil, 0)
	if !waitExit(p, 10*time.Second) {
		return fmt.Errorf("pid %d survived SIGKILL", pid)
	}
	return nil
}

func (f *fixture) stoppedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.stopped...)
}

// open takes a pidfd on pid if it carries the tag (one of this test's
// processes).
func open(pid int, tag string) (int, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, err
	}
	// The environment reads empty while the process is in the middle of an
	// execve: look again until it carries the tag or the process is gone.
	// Only this test's processes carry its tag.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if v, ok := proctest.Env(pid, tagVar); ok && v == tag {
			return fd, nil
		}
		if waitExit(fd, 0) || time.Now().After(deadline) {
			unix.Close(fd)
			return -1, fmt.Errorf("pid %d is not one of this test's processes", pid)
		}
	}
}

func waitExit(fd int, d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(d/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

// startBackground starts a tagged process in sb that outlives the exec and
// records its pid where the fixture's StopSandbox finds it; the test kills
// it when it ends, whatever happens.
func (f *fixture) startBackground(sb sandbox.Sandbox) int {
	t := f.t
	t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{
		Argv: []string{"sh", "-c", `setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$1"; echo $!`, "sh", filepath.Join(sb.Root(), "test.pid")},
		Env:  map[string]string{tagVar: f.tag}, Timeout: time.Minute,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start a background process: %v %q", err, res.Stderr)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if err != nil {
		t.Fatal(err)
	}
	fd, err := open(pid, f.tag)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		waitExit(fd, 10*time.Second)
		unix.Close(fd)
	})
	return fd
}

func (f *fixture) seed(body any) owner.SeedReply {
	f.t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		f.t.Fatal(err)
	}
	r, err := f.o.SeedSession(context.Background(), "", raw)
	if err != nil {
		f.t.Fatalf("seed: %v", err)
	}
	return r
}

func (f *fixture) connect(c owner.Cookies) sandbox.Sandbox {
	f.t.Helper()
	a, err := f.o.SandboxAccess(context.Background(), "", c)
	if err != nil {
		f.t.Fatalf("access: %v", err)
	}
	sb, err := f.b.Connect(context.Background(), a.Connection.Descriptor)
	if err != nil {
		f.t.Fatal(err)
	}
	return sb
}

func (f *fixture) sh(sb sandbox.Sandbox, script string) string {
	f.t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: time.Minute})
	if err != nil || res.ExitCode != 0 {
		f.t.Fatalf("sh -c %q: %v exit %d %q", script, err, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

func (f *fixture) verify(c owner.Cookies, body map[string]any) (owner.VerifyReply, map[string]any) {
	f.t.Helper()
	raw, _ := json.Marshal(body)
	r, err := f.o.Verify(context.Background(), "", c, raw)
	if err != nil {
		f.t.Fatalf("verify: %v", err)
	}
	var out map[string]any
	if err := json.Unmarshal(r.Body, &out); err != nil {
		f.t.Fatalf("verify reply body %q: %v", r.Body, err)
	}
	return r, out
}

// seedAt seeds a session bound to the attempt key (a capture key), as
// Gym's resources calls under /ng-rollout/<key>/ do.
func (f *fixture) seedAt(key string, body any) owner.SeedReply {
	f.t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		f.t.Fatal(err)
	}
	r, err := f.o.SeedSession(context.Background(), key, raw)
	if err != nil {
		f.t.Fatalf("seed %s: %v", key, err)
	}
	return r
}

// gymInstance is the owner's participant instance in the tests'
// checkpoints.
const gymInstance = "lending-test"

// control is the owner's checkpoint control plane in process, made once:
// what `ngdriver owner serve` puts behind HTTP.
func (f *fixture) control() *gym.Control {
	f.t.Helper()
	if f.ctl == nil {
		c, err := owner.NewControl(f.o, gym.Config{Instance: gymInstance, LeaseGrace: time.Minute, Logf: f.t.Logf})
		if err != nil {
			f.t.Fatal(err)
		}
		f.ctl = c
	}
	return f.ctl
}

func request(id string) gym.Request {
	return gym.Request{CheckpointID: id, DeadlineTS: float64(time.Now().Add(time.Minute).UnixNano()) / 1e9}
}

// checkpoint takes checkpoint id into dir as Gym's coordinator drives a
// participant: prepare (ready by its deadline), commit, resume.
func checkpoint(c *gym.Control, id, dir string) error {
	ctx := context.Background()
	rep, err := c.Prepare(ctx, request(id))
	if err != nil {
		return fmt.Errorf("prepare %s: %w", id, err)
	}
	if rep.Phase != gym.PhasePrepared {
		return fmt.Errorf("prepare %s: %s, blocked by %v", id, rep.Phase, rep.Report.Blockers)
	}
	if _, err := c.Commit(ctx, &gym.CommitRequest{Request: request(id), CheckpointDir: dir}); err != nil {
		return fmt.Errorf("commit %s: %w", id, err)
	}
	if _, err := c.Resume(ctx, request(id)); err != nil {
		return fmt.Errorf("resume %s: %w", id, err)
	}
	return nil
}

// commit takes checkpoint id into dir (checkpoint) and returns the records
// the owner wrote, by capture key.
func (f *fixture) commit(id, dir string) map[string]Record {
	f.t.Helper()
	if err := checkpoint(f.control(), id, dir); err != nil {
		f.t.Fatal(err)
	}
	out := map[string]Record{}
	_, err := gym.ReadState(dir, gym.KindResources, gymInstance, func(r gym.Record) error {
		var rec Record
		if err := r.Decode(&rec); err != nil {
			return err
		}
		out[rec.EpisodeID.CaptureKey()] = rec
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

// restore restores, into this owner, the records of the attempts keys
// from the checkpoint in dir (each continues as its next attempt), as a
// restore named id, then resumes.
func (f *fixture) restore(id, dir string, keys ...string) {
	f.t.Helper()
	var scope []gym.EpisodeID
	for _, k := range keys {
		e, err := gym.ParseCaptureKey(k)
		if err != nil {
			f.t.Fatal(err)
		}
		scope = append(scope, e)
	}
	ctx := context.Background()
	c := f.control()
	if _, err := c.Restore(ctx, &gym.RestoreRequest{Request: request(id), CheckpointDir: dir, EpisodeIDs: scope}); err != nil {
		f.t.Fatalf("restore %s from %s: %v", id, dir, err)
	}
	if _, err := c.Resume(ctx, request(id)); err != nil {
		f.t.Fatalf("resume %s: %v", id, err)
	}
}

// accessAt connects to the sandbox the session of attempt key lends now.
func (f *fixture) accessAt(key string, c owner.Cookies) sandbox.Sandbox {
	f.t.Helper()
	a, err := f.o.SandboxAccess(context.Background(), key, c)
	if err != nil {
		f.t.Fatalf("access %s: %v", key, err)
	}
	sb, err := f.b.Connect(context.Background(), a.Connection.Descriptor)
	if err != nil {
		f.t.Fatal(err)
	}
	return sb
}

func (f *fixture) sandboxCount() int {
	entries, err := os.ReadDir(filepath.Join(f.b.Base(), "sandboxes"))
	if err != nil {
		f.t.Fatal(err)
	}
	return len(entries)
}

func TestSeedAccessVerifyPassingCheck(t *testing.T) {
	f := newFixture(t, Options{})
	body := map[string]any{
		"rollout_id": "r-1",
		"task":       "write the answer",
		"check":      `test "$(cat greeting.txt)" = 'hello "world"' && test -f sub/dir/x`,
		"files":      map[string]string{"greeting.txt": `hello "world"`, "sub/dir/x": "deep"},
		"extra":      map[string]any{"kept": true},
	}
	r := f.seed(body)
	sid := SessionIDOf(r.Cookies)
	if len(sid) != 24 || len(r.Cookies[CookieName]) != 24+1+64 || !strings.HasPrefix(r.Cookies[CookieName], sid+".") || r.Restart || r.VerifyMode != "" {
		t.Fatalf("seed reply %+v", r)
	}
	var sbody struct {
		Handle  string `json:"sandbox_handle"`
		Workdir string `json:"workdir"`
	}
	if err := json.Unmarshal(r.Body, &sbody); err != nil {
		t.Fatal(err)
	}
	if sbody.Handle != "sb-"+sid+"-0" || sbody.Workdir == "" {
		t.Fatalf("seed body %s", r.Body)
	}

	a, err := f.o.SandboxAccess(context.Background(), "", r.Cookies)
	if err != nil {
		t.Fatal(err)
	}
	d := a.Connection.Descriptor
	if a.Connection.Kind != "direct" || d.Provider != "local" || d.SandboxID != sbody.Handle || d.Workdir != sbody.Workdir || a.Workdir != sbody.Workdir {
		t.Fatalf("access %+v", a)
	}
	sb := f.connect(r.Cookies)
	if got := f.sh(sb, "cat greeting.txt; echo; pwd"); got != `hello "world"`+"\n"+sbody.Workdir+"\n" {
		t.Fatalf("the seed's files in the workdir: %q", got)
	}

	body["response"] = map[string]any{"output": "done"}
	vr, out := f.verify(r.Cookies, body)
	if vr.Reward != 1 || vr.FailureKind != "" || vr.MaskSample {
		t.Fatalf("verify %+v", vr)
	}
	if out["reward"] != 1.0 || out["mask_sample"] != false || out["rollout_id"] != "r-1" || out["response"] == nil || out["extra"] == nil {
		t.Fatalf("verify body %v", out)
	}
	if _, ok := out["failure_kind"]; ok {
		t.Errorf("failure_kind on a pass: %v", out)
	}
	if got := f.stoppedIDs(); len(got) != 1 || got[0] != sbody.Handle {
		t.Errorf("StopSandbox calls %v", got)
	}
	info, err := f.o.Session(r.Cookies)
	if err != nil || !info.Closed || !info.Verified || info.SandboxID != sbody.Handle || info.RolloutID != "r-1" {
		t.Fatalf("session %+v %v", info, err)
	}

	// The session has ended.
	if _, err := f.o.SandboxAccess(context.Background(), "", r.Cookies); !errors.Is(err, owner.ErrClosed) {
		t.Errorf("access after verify: want ErrClosed, got %v", err)
	}
	raw, _ := json.Marshal(body)
	if _, err := f.o.Verify(context.Background(), "", r.Cookies, raw); !errors.Is(err, owner.ErrClosed) {
		t.Errorf("second verify: want ErrClosed, got %v", err)
	}
	if err := f.o.CloseSession(context.Background(), "", r.Cookies); err != nil {
		t.Errorf("close after verify: %v", err)
	}
	// A late seed for the closed session does not recreate it.
	n := f.sandboxCount()
	if _, err := f.o.SeedSessionWith(context.Background(), "", r.Cookies, raw); !errors.Is(err, owner.ErrClosed) {
		t.Errorf("late seed: want ErrClosed, got %v", err)
	}
	if f.sandboxCount() != n {
		t.Errorf("a late seed made a sandbox")
	}
	if got := f.stoppedIDs(); len(got) != 1 {
		t.Errorf("StopSandbox calls after the end: %v", got)
	}
}

func TestVerifyFailingCheckNamesItsOutput(t *testing.T) {
	f := newFixture(t, Options{})
	r := f.seed(map[string]any{"task": "t", "check": `echo "the answer is wrong: $(cat a)" >&2; exit 3`, "files": map[string]string{"a": "41"}})
	vr, out := f.verify(r.Cookies, map[string]any{"task": "t", "response": "x"})
	if vr.Reward != 0 || vr.FailureKind != FailureCheckFailed {
		t.Fatalf("verify %+v", vr)
	}
	for _, want := range []string{"the answer is wrong: 41", "code 3"} {
		if !strings.Contains(vr.FailureReason, want) {
			t.Errorf("failure reason %q does not name %q", vr.FailureReason, want)
		}
	}
	if out["reward"] != 0.0 || out["failure_kind"] != FailureCheckFailed || out["failure_reason"] != vr.FailureReason {
		t.Errorf("verify body %v", out)
	}
	if info, _ := f.o.Session(r.Cookies); !info.Closed || !info.Verified {
		t.Errorf("session %+v", info)
	}

	// Stdout is used when the check writes nothing on stderr.
	r = f.seed(map[string]any{"check": "echo only stdout; false"})
	vr, _ = f.verify(r.Cookies, map[string]any{})
	if !strings.Contains(vr.FailureReason, "only stdout") {
		t.Errorf("failure reason %q", vr.FailureReason)
	}
}

func TestVerifyCheckTimeout(t *testing.T) {
	f := newFixture(t, Options{CheckTimeout: 500 * time.Millisecond})
	r := f.seed(map[string]any{"check": "echo started >&2; exec sleep 300"})
	vr, _ := f.verify(r.Cookies, map[string]any{})
	if vr.Reward != 0 || vr.FailureKind != FailureCheckTimeout || !strings.Contains(vr.FailureReason, "started") {
		t.Fatalf("verify %+v", vr)
	}
}

func TestVerifyWithoutCheckRewardsOne(t *testing.T) {
	f := newFixture(t, Options{})
	r := f.seed(map[string]any{"task": "anything"})
	if vr, _ := f.verify(r.Cookies, map[string]any{}); vr.Reward != 1 {
		t.Fatalf("verify %+v", vr)
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	f := newFixture(t, Options{})
	r := f.seed(map[string]any{"task": "t"})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if err := f.o.CloseSession(ctx, "", r.Cookies); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
	}
	if got := f.stoppedIDs(); len(got) != 1 {
		t.Errorf("StopSandbox calls %v, want one", got)
	}
	if _, err := f.o.SandboxAccess(ctx, "", r.Cookies); !errors.Is(err, owner.ErrClosed) {
		t.Errorf("access after close: want ErrClosed, got %v", err)
	}
	if _, err := f.o.Verify(ctx, "", r.Cookies, json.RawMessage(`{}`)); !errors.Is(err, owner.ErrClosed) {
		t.Errorf("verify after close: want ErrClosed, got %v", err)
	}
	if info, _ := f.o.Session(r.Cookies); !info.Closed || info.Verified {
		t.Errorf("session %+v", info)
	}
}

func TestCloseStopsTheSandboxProcesses(t *testing.T) {
	f := newFixture(t, Options{RemoveUnused: true})
	r := f.seed(map[string]any{"task": "t"})
	sb := f.connect(r.Cookies)
	fd := f.startBackground(sb)
	if err := f.o.CloseSession(context.Background(), "", r.Cookies); err != nil {
		t.Fatal(err)
	}
	if !waitExit(fd, 0) {
		t.Error("the sandbox's process survived the close")
	}
	if _, err := f.b.Open(sb.ID()); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("RemoveUnused: the closed session's sandbox is still there (%v)", err)
	}
}

// TestASandboxIsRemovedOnlyOnceItsProcessesAreEnded: with RemoveUnused a
// verified session's sandbox goes once StopSandbox ended its processes;
// when StopSandbox fails the sandbox is kept (its process still runs in
// it); with KeepFailed a session closed without a verdict keeps its
// sandbox, its process ended.
func TestASandboxIsRemovedOnlyOnceItsProcessesAreEnded(t *testing.T) {
	f := newFixture(t, Options{RemoveUnused: true, KeepFailed: true})
	ctx := context.Background()

	r := f.seed(map[string]any{"task": "t"})
	sb := f.connect(r.Cookies)
	fd := f.startBackground(sb)
	f.verify(r.Cookies, map[string]any{})
	if !waitExit(fd, 0) {
		t.Error("the verified sandbox's process survived")
	}
	if _, err := f.b.Open(sb.ID()); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("the verified session's sandbox is still there (%v)", err)
	}

	r = f.seed(map[string]any{"task": "t"})
	sb = f.connect(r.Cookies)
	fd = f.startBackground(sb)
	f.o.opt.StopSandbox = func(context.Context, sandbox.Sandbox) error { return errors.New("ngsup stop: 1 process survived") }
	f.verify(r.Cookies, map[string]any{})
	if _, err := f.b.Open(sb.ID()); err != nil {
		t.Errorf("the sandbox whose processes could not be stopped was removed: %v", err)
	}
	if waitExit(fd, 0) {
		t.Error("the process the failed stop left is gone; the test proves nothing")
	}
	f.o.opt.StopSandbox = f.stop

	r = f.seed(map[string]any{"task": "t"})
	sb = f.connect(r.Cookies)
	fd = f.startBackground(sb)
	if err := f.o.CloseSession(ctx, "", r.Cookies); err != nil {
		t.Fatal(err)
	}
	if !waitExit(fd, 0) {
		t.Error("the closed sandbox's process survived the close")
	}
	if _, err := f.b.Open(sb.ID()); err != nil {
		t.Errorf("KeepFailed: the sandbox of a session closed without a verdict went: %v", err)
	}
}

// TestVerifyEndsTheSandboxWhenItsCallerLeaves: a verify whose caller goes
// away (its context cancelled) while the verified session's sandbox is
// being stopped still ends the sandbox's processes and removes it. The
// session is closed either way, and nothing would retry the stop.
func TestVerifyEndsTheSandboxWhenItsCallerLeaves(t *testing.T) {
	f := newFixture(t, Options{RemoveUnused: true})
	r := f.seed(map[string]any{"task": "t"})
	sb := f.connect(r.Cookies)
	fd := f.startBackground(sb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.o.opt.StopSandbox = func(sctx context.Context, sb sandbox.Sandbox) error {
		cancel() // the caller leaves as the stop begins
		if err := sctx.Err(); err != nil {
			return err // as a stop run through an exec does
		}
		return f.stop(sctx, sb)
	}
	if _, err := f.o.Verify(ctx, "", r.Cookies, []byte(`{}`)); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if !waitExit(fd, 0) {
		t.Error("the verified sandbox's process survived its caller leaving")
	}
	if _, err := f.b.Open(sb.ID()); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("the verified session's sandbox is still there (%v)", err)
	}
}

func TestRestartAndNoSandboxFlags(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	r := f.seed(map[string]any{"task": "t", "restart": true, "verify_mode": "replay"})
	if !r.Restart || r.VerifyMode != "replay" {
		t.Errorf("seed reply %+v", r)
	}
	if _, err := f.o.SandboxAccess(ctx, "", r.Cookies); err != nil {
		t.Errorf("a restart session still lends its sandbox: %v", err)
	}

	n := f.sandboxCount()
	r = f.seed(map[string]any{"task": "t", "no_sandbox": true, "check": "test \"$(cat f)\" = seeded", "files": map[string]string{"f": "seeded"}})
	if f.sandboxCount() != n {
		t.Errorf("a no_sandbox seed made a sandbox")
	}
	if string(r.Body) != "{}" {
		t.Errorf("no_sandbox seed body %s", r.Body)
	}
	if _, err := f.o.SandboxAccess(ctx, "", r.Cookies); !errors.Is(err, owner.ErrNoSandbox) {
		t.Errorf("access: want ErrNoSandbox, got %v", err)
	}
	// Its check runs in a scratch sandbox holding the seed's files, removed
	// afterwards.
	if vr, _ := f.verify(r.Cookies, map[string]any{}); vr.Reward != 1 {
		t.Errorf("verify %+v", vr)
	}
	if f.sandboxCount() != n {
		t.Errorf("the scratch sandbox was left behind")
	}
	if info, _ := f.o.Session(r.Cookies); !info.NoSandbox || info.SandboxID != "" || !info.Closed {
		t.Errorf("session %+v", info)
	}
}

func TestBadBodiesAndCookies(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	for _, body := range []string{
		`[]`, `"text"`, `null`, `not json`, ``, `42`,
		`{"task": 5}`, `{"task": {"x": 1}}`, `{"check": []}`, `{"rollout_id": 7}`,
		`{"files": {"../escape": "x"}}`, `{"files": {"/abs": "x"}}`, `{"files": {".": "x"}}`, `{"files": {"a": 1}}`, `{"files": []}`,
		`{"verify_mode": "fast"}`, `{"restart": "yes"}`, `{"no_sandbox": 1}`,
	} {
		if _, err := f.o.SeedSession(ctx, "", json.RawMessage(body)); err == nil {
			t.Errorf("seed accepted %s", body)
		} else if !errors.Is(err, ErrBadRunBody) || !ClientError(err) {
			t.Errorf("seed of %s: %v, want ErrBadRunBody (the caller's fault)", body, err)
		} else {
			t.Logf("%s: %v", body, err)
		}
	}
	if n := f.sandboxCount(); n != 0 {
		t.Errorf("bad seeds made %d sandboxes", n)
	}
	// Unknown fields and a null task are fine.
	f.seed(map[string]any{"task": nil, "responses_create_params": map[string]any{"input": []any{}}})

	// A cookie that proves no session is refused as unauthorized, and the
	// refusal does not echo it.
	unknown := owner.Cookies{CookieName: "feedface"}
	if _, err := f.o.SandboxAccess(ctx, "", unknown); !errors.Is(err, ErrSessionCookie) || !errors.Is(err, gym.ErrUnauthorized) || strings.Contains(err.Error(), "feedface") {
		t.Errorf("unknown session: %v", err)
	}
	if err := f.o.CloseSession(ctx, "", owner.Cookies{}); !errors.Is(err, ErrSessionCookie) {
		t.Errorf("no cookie: %v", err)
	}
	if _, err := f.o.Verify(ctx, "", unknown, json.RawMessage(`{}`)); !errors.Is(err, ErrSessionCookie) {
		t.Errorf("verify of an unknown session: %v", err)
	}
	r := f.seed(map[string]any{"task": "t"})
	if _, err := f.o.Verify(ctx, "", r.Cookies, json.RawMessage(`[1]`)); err == nil {
		t.Error("verify accepted a body that is not an object")
	} else if !errors.Is(err, ErrBadVerifyBody) || !ClientError(err) {
		t.Errorf("verify of a body that is not an object: %v, want ErrBadVerifyBody (the caller's fault)", err)
	}
	if info, _ := f.o.Session(r.Cookies); info.Closed {
		t.Error("a rejected verify closed the session")
	}
	// A seed whose cookies name an open session answers with it again.
	again, err := f.o.SeedSessionWith(ctx, "", r.Cookies, json.RawMessage(`{"task": "t"}`))
	if err != nil || again.Cookies[CookieName] != r.Cookies[CookieName] || string(again.Body) != string(r.Body) {
		t.Errorf("re-seed of an open session: %+v %v", again, err)
	}
}

func TestHostileTaskTextIsNeverExecuted(t *testing.T) {
	f := newFixture(t, Options{})
	marker := filepath.Join(t.TempDir(), "pwned")
	task := "$(touch " + marker + ") `touch " + marker + "` '; touch " + marker + "; ' \"; touch " + marker + "; \" \n touch " + marker
	content := `it's "quoted" $(touch ` + marker + `) and \back`
	body := map[string]any{
		"task":  task,
		"check": `test "$(cat q.txt)" = 'it'"'"'s "quoted" $(touch ` + marker + `) and \back'`,
		"files": map[string]string{"q.txt": content, "it's $(x)/\"odd\" name": task},
	}
	r := f.seed(body)
	sb := f.connect(r.Cookies)
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"cat", "it's $(x)/\"odd\" name"}})
	if err != nil || string(res.Stdout) != task {
		t.Fatalf("the hostile file: %q %v", res.Stdout, err)
	}
	body["response"] = task
	vr, out := f.verify(r.Cookies, body)
	if vr.Reward != 1 {
		t.Fatalf("the quoted check failed: %+v", vr)
	}
	if out["task"] != task || out["response"] != task {
		t.Errorf("the task text changed on its way through: %v", out)
	}
	if _, err := os.Lstat(marker); err == nil {
		t.Fatal("the task text was executed")
	}
}

// TestACommitExportsOpenSessionsAndARestoreForksThem, through the
// owner's control plane as Gym drives it: a commit snapshots the sandbox
// of every open session bound to an attempt (not one closed before it); a
// restore into the same owner forks each snapshot under a new sandbox id
// (sb-<session>-1) holding the snapshot's files at the same paths, bound
// to the next attempt, open and not verified, and ends what still ran in
// the sandbox it replaces (by its mount namespace with namespace
// isolation, else through StopSandbox), which it keeps; a session outside
// the checkpoint stays as it was; the restored session verifies on the
// fork; and a second restore forks again, under yet another id.
func TestACommitExportsOpenSessionsAndARestoreForksThem(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	r1 := f.seedAt("one", map[string]any{"task": "one", "check": "test \"$(cat state)\" = at-checkpoint"})
	r2 := f.seedAt("two", map[string]any{"task": "two"})
	r3 := f.seedAt("three", map[string]any{"task": "closed before the checkpoint"})
	if err := f.o.CloseSession(ctx, "three", r3.Cookies); err != nil {
		t.Fatal(err)
	}
	sb1, sb2 := f.accessAt("one", r1.Cookies), f.accessAt("two", r2.Cookies)
	f.sh(sb1, "echo at-checkpoint > state; mkdir -p .opencode && echo session > .opencode/db")
	f.sh(sb2, "echo two-at-checkpoint > state")
	old1 := sb1.ID()

	dir := t.TempDir()
	records := f.commit("ckpt/7: step 100", dir)
	s1, s2 := SessionIDOf(r1.Cookies), SessionIDOf(r2.Cookies)
	if len(records) != 2 || records["one"].SessionID != s1 || records["two"].SessionID != s2 {
		t.Fatalf("records %+v (the closed session must not be in it)", records)
	}
	for _, rec := range records {
		if !f.b.HasSnapshot(rec.State.Snapshot) {
			t.Errorf("snapshot %s missing", rec.State.Snapshot)
		}
	}

	// After the checkpoint the runs go on: files change, a process runs
	// in session two's sandbox, and the session of run one even ends.
	f.sh(sb1, "echo after > state; echo new > later")
	fd := f.startBackground(sb2)
	if vr, err := f.o.Verify(ctx, "one", r1.Cookies, json.RawMessage(`{}`)); err != nil || vr.Reward != 0 {
		t.Fatalf("the changed state should fail the check: %+v %v", vr, err)
	}

	f.restore("restore-1", dir, "one", "two")
	info1, _ := f.o.Session(r1.Cookies)
	if info1.SandboxID == old1 || info1.SandboxID != "sb-"+s1+"-1" || info1.Closed || info1.Verified || info1.Key != "one-a1" {
		t.Fatalf("restored session %+v (old sandbox %s)", info1, old1)
	}
	if !waitExit(fd, 10*time.Second) {
		t.Error("the restore did not end the process of the sandbox it replaced")
	}
	// Session two's sandbox was neither verified nor closed: only the
	// restore ended its processes.
	stopped := strings.Join(f.stoppedIDs(), " ")
	switch f.b.Isolation() {
	case local.IsolationNone:
		if !strings.Contains(stopped, sb2.ID()) {
			t.Errorf("StopSandbox calls %s, want %s", stopped, sb2.ID())
		}
	case local.IsolationNamespace:
		if strings.Contains(stopped, sb2.ID()) {
			t.Errorf("the replaced sandbox %s was ended through StopSandbox (calls %s), not by its mount namespace", sb2.ID(), stopped)
		}
	}
	fork1 := f.accessAt("one-a1", r1.Cookies)
	if fork1.ID() != info1.SandboxID {
		t.Fatalf("access names %s, session %s", fork1.ID(), info1.SandboxID)
	}
	if f.b.Isolation() == local.IsolationNamespace && fork1.Workdir() != sb1.Workdir() {
		t.Errorf("the fork's workdir %s differs from the original's %s", fork1.Workdir(), sb1.Workdir())
	}
	if got := f.sh(fork1, "cat state .opencode/db; test -e later || echo no-later"); got != "at-checkpoint\nsession\nno-later\n" {
		t.Errorf("the fork holds %q, not the snapshot's files", got)
	}
	// The old sandbox is left as it was (kept for inspection).
	if got := f.sh(sb1, "cat state"); got != "after\n" {
		t.Errorf("the old sandbox changed: %q", got)
	}
	if info3, _ := f.o.Session(r3.Cookies); !info3.Closed {
		t.Error("a session outside the checkpoint was reopened")
	}
	// The restored session verifies on the fork.
	if vr, err := f.o.Verify(ctx, "one-a1", r1.Cookies, json.RawMessage(`{}`)); err != nil || vr.Reward != 1 {
		t.Errorf("verify on the fork %+v %v", vr, err)
	}

	// A second restore forks again, under yet another id.
	f.restore("restore-2", dir, "one")
	if info, _ := f.o.Session(r1.Cookies); info.SandboxID != "sb-"+s1+"-2" || info.Closed {
		t.Errorf("second restore %+v", info)
	}
}

// TestEndUnownedEndsWhatNoSessionUses proves what an owner started again
// on a base ends before it serves: with namespace isolation, a process
// still running in a sandbox no session of this owner uses (its session
// was the dead owner's) is ended by the mount namespace it runs in, with
// no StopSandbox or KillSandbox to do it; the owner says how many it
// ended.
func TestEndUnownedEndsWhatNoSessionUses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("namespace isolation needs root")
	}
	f := newFixture(t, Options{})
	r := f.seed(map[string]any{"task": "left running by a dead owner"})
	fd := f.startBackground(f.connect(r.Cookies))
	fresh := New(Options{Backend: f.b, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	n, err := fresh.EndUnowned(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || !waitExit(fd, 10*time.Second) {
		t.Fatalf("EndUnowned ended %d processes and the sandbox's process lives on", n)
	}
}

// TestRestoreRemovesReplacedSandboxWhenAsked: with RemoveUnused, the
// sandbox a restore replaces is removed once its processes are ended, and
// the next attempt is lent the fork.
func TestRestoreRemovesReplacedSandboxWhenAsked(t *testing.T) {
	f := newFixture(t, Options{RemoveUnused: true})
	r := f.seedAt("t", map[string]any{"task": "t"})
	old := f.accessAt("t", r.Cookies).ID()
	dir := t.TempDir()
	f.commit("ck1", dir)
	f.restore("restore-ck1", dir, "t")
	if _, err := f.b.Open(old); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("the replaced sandbox %s is still there (%v)", old, err)
	}
	if sb := f.accessAt("t-a1", r.Cookies); sb.ID() == old {
		t.Error("access still names the old sandbox")
	}
}

// TestConcurrentRuns: eight runs seed, verify and close at once while a
// checkpoint is prepared, committed and resumed through the control plane
// (calls wait while admission is closed); every run is verified.
func TestConcurrentRuns(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	const runs = 8
	var wg sync.WaitGroup
	errs := make(chan error, runs*2)
	for i := 0; i < runs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("run%d", i)
			raw, _ := json.Marshal(map[string]any{"task": fmt.Sprint(i), "check": fmt.Sprintf("test \"$(cat n)\" = %d", i), "files": map[string]string{"n": fmt.Sprint(i)}})
			r, err := f.o.SeedSession(ctx, key, raw)
			if err != nil {
				errs <- err
				return
			}
			if _, err := f.o.SandboxAccess(ctx, key, r.Cookies); err != nil {
				errs <- err
				return
			}
			vr, err := f.o.Verify(ctx, key, r.Cookies, raw)
			if err != nil || vr.Reward != 1 {
				errs <- fmt.Errorf("run %d: %+v %v", i, vr, err)
			}
			if err := f.o.CloseSession(ctx, key, r.Cookies); err != nil {
				errs <- err
			}
		}()
	}
	wg.Add(1)
	c, dir := f.control(), t.TempDir()
	go func() {
		defer wg.Done()
		if err := checkpoint(c, "concurrent", dir); err != nil {
			errs <- err
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestConcurrentSeedsOfOneKeyMakeOneSession: seeds of the same capture key
// at once make one session and one sandbox; one of them answers it, the
// others (without its cookie) are refused and get no cookie.
func TestConcurrentSeedsOfOneKeyMakeOneSession(t *testing.T) {
	f := newFixture(t, Options{})
	const n = 8
	replies := make([]owner.SeedReply, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i], errs[i] = f.o.SeedSession(context.Background(), "k-a3", json.RawMessage(`{"files": {"x": "y"}}`))
		}()
	}
	wg.Wait()
	won := -1
	for i := range n {
		switch {
		case errs[i] == nil && won < 0:
			won = i
		case errs[i] == nil:
			t.Fatalf("seeds %d and %d both answered: %v, %v", won, i, replies[won].Cookies, replies[i].Cookies)
		case !errors.Is(errs[i], ErrSessionCookie) || len(replies[i].Cookies) > 0:
			t.Fatalf("seed %d: %v (cookies %v), want a refusal without a cookie", i, errs[i], replies[i].Cookies)
		}
	}
	if won < 0 {
		t.Fatal("no seed answered")
	}
	if got := f.sandboxCount(); got != 1 {
		t.Fatalf("%d sandboxes for one attempt, want 1", got)
	}
	info, err := f.o.Session(replies[won].Cookies)
	if err != nil || info.Key != "k-a3" {
		t.Fatalf("session %+v %v", info, err)
	}
	if _, err := f.o.SeedSession(context.Background(), "r-a1-a2", json.RawMessage(`{}`)); err == nil {
		t.Fatal("a seed under the malformed key r-a1-a2 was taken")
	}
}

// forkUser is the local backend's lender as OpenSandbox's Docker runtime
// behaves: a snapshot a sandbox forked from it still uses is refused with
// sandbox.ErrSnapshotInUse (and stays) until that sandbox is removed.
type forkUser struct {
	sandbox.Lender
	mu    sync.Mutex
	users map[string]string // fork id -> snapshot
}

func (u *forkUser) Fork(ctx context.Context, snap, name string) (sandbox.Sandbox, error) {
	sb, err := u.Lender.Fork(ctx, snap, name)
	if err == nil {
		u.mu.Lock()
		u.users[sb.ID()] = snap
		u.mu.Unlock()
	}
	return sb, err
}

func (u *forkUser) Remove(ctx context.Context, id string) error {
	u.mu.Lock()
	delete(u.users, id)
	u.mu.Unlock()
	return u.Lender.Remove(ctx, id)
}

func (u *forkUser) RemoveSnapshot(ctx context.Context, id string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	for fork, snap := range u.users {
		if snap == id {
			return fmt.Errorf("delete snapshot %s: used by sandbox %s: %w", id, fork, sandbox.ErrSnapshotInUse)
		}
	}
	return u.Lender.RemoveSnapshot(ctx, id)
}

// TestSnapshotAForkUsesIsRemovedOnceTheForkIsGone proves a snapshot the
// owner drops while a sandbox forked from it still uses it (the backend
// answers sandbox.ErrSnapshotInUse) is no failure: once the controller
// has deleted the checkpoint that named it, the next commit drops it and
// warns of nothing, the snapshot is kept, and it is removed as soon as
// that fork is removed (here by the next restore), with no other call.
// It does so over two lenders: "stub", the local backend's lender behind
// forkUser, and "opensandbox", the OpenSandbox backend over the fake
// server of internal/fake/execd, whose refusal is the real server's 409
// SNAPSHOT::DELETE_CONFLICT (the snapshot is then left Deleting on the
// server, which is where its presence is read).
func TestSnapshotAForkUsesIsRemovedOnceTheForkIsGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lender makes the lender the owner lends through, on f's
		// backend; state reads a snapshot's state ("" once it is gone)
		// and inUse is the state of one kept while a fork uses it.
		lender func(t *testing.T, f *fixture) (l sandbox.Lender, state func(snap string) string, inUse string)
	}{
		{"stub", func(t *testing.T, f *fixture) (sandbox.Lender, func(string) string, string) {
			state := func(snap string) string {
				if f.b.HasSnapshot(snap) {
					return "present"
				}
				return ""
			}
			return &forkUser{Lender: f.b.Lender(), users: map[string]string{}}, state, "present"
		}},
		{"opensandbox", func(t *testing.T, f *fixture) (sandbox.Lender, func(string) string, string) {
			if os.Geteuid() != 0 {
				t.Skip("the fake OpenSandbox runs sandboxes in mount namespaces of their own: it needs root")
			}
			// The fake keeps its sandboxes in the fixture's backend, so
			// the fixture's StopSandbox finds their folders by id.
			const key = "lending-test-key"
			srv, err := fakeexecd.Start(fakeexecd.Options{Store: f.b, APIKey: key, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Close)
			mp := f.b.MountPoint()
			b, err := opensandbox.New(opensandbox.Options{Server: srv.URL(), APIKey: key, Image: "fake",
				Root: mp + "/" + local.RootFolder, Workdir: mp + "/" + local.WorkFolder, Poll: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			return b, srv.SnapshotState, "Deleting"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Options{})
			lender, state, inUse := tc.lender(t, f)
			var logs syncbuf.Buffer
			f.o = New(Options{
				Sandboxes:    lender,
				StopSandbox:  f.stop,
				RemoveUnused: true,
				Logger:       slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testWriter{t}), nil)),
			})
			ctx := context.Background()
			r := f.seedAt("k", map[string]any{"files": map[string]string{"a.txt": "one"}})
			dir1 := t.TempDir()
			s1 := f.commit("c1", dir1)["k"].State.Snapshot
			if s1 == "" || state(s1) == "" {
				t.Fatalf("the commit's snapshot %q is not there", s1)
			}
			f.restore("restore-c1", dir1, "k")
			info, err := f.o.Session(r.Cookies)
			if err != nil {
				t.Fatal(err)
			}
			fork := info.SandboxID
			if _, err := lender.Open(ctx, fork); err != nil {
				t.Fatalf("the fork %s of %s: %v", fork, s1, err)
			}
			if err := os.RemoveAll(dir1); err != nil {
				t.Fatal(err)
			}
			dir2 := t.TempDir()
			f.commit("c2", dir2)
			if got := state(s1); got != inUse {
				t.Fatalf("the snapshot %s the fork uses is %q, want %q", s1, got, inUse)
			}
			if kept := f.o.KeptInUse(); !slices.Equal(kept, []string{s1}) {
				t.Errorf("kept in use: %v, want %s", kept, s1)
			}
			f.restore("restore-c2", dir2, "k-a1")
			if _, err := lender.Open(ctx, fork); !errors.Is(err, sandbox.ErrGone) {
				t.Errorf("the fork %s is still there after the restore that replaced it (%v)", fork, err)
			}
			if got := state(s1); got != "" {
				t.Errorf("the snapshot %s is still there (%s) after the fork that used it was removed", s1, got)
			}
			if kept := f.o.KeptInUse(); len(kept) != 0 {
				t.Errorf("still kept in use: %v", kept)
			}
			if strings.Contains(logs.String(), "level=WARN") {
				t.Errorf("the owner warned:\n%s", logs.String())
			}
		})
	}
}
