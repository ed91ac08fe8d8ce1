package opensandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

const apiKey = "test-key"

type fixture struct {
	t   *testing.T
	srv *fakeexecd.Server
	b   *opensandbox.Backend
}

func newFixture(t *testing.T) *fixture {
	return newFixtureWith(t, fakeexecd.Options{}, opensandbox.Options{})
}

// newFixtureWith is a fake OpenSandbox (real execd's timing unless fo
// says otherwise) and a backend on it (bo adds to the usual options).
func newFixtureWith(t *testing.T, fo fakeexecd.Options, bo opensandbox.Options) *fixture {
	t.Helper()
	if why := fakeexecd.SkipIfReal(); why != "" {
		t.Skip(why)
	}
	if os.Geteuid() != 0 {
		t.Skip("the fake execd runs commands in mount namespaces of their own: it needs root")
	}
	fo.Base, fo.APIKey = t.TempDir(), apiKey
	srv, err := fakeexecd.Start(fo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	bo.Server, bo.APIKey, bo.Image = srv.URL(), apiKey, "ubuntu:24.04"
	bo.Root, bo.Workdir = "/sandbox/.ngharness", "/sandbox/work"
	bo.Poll, bo.RetryFor = 20*time.Millisecond, 10*time.Second
	b, err := opensandbox.New(bo)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, srv: srv, b: b}
}

func (f *fixture) create(name string) *opensandbox.Sandbox {
	f.t.Helper()
	sb, err := f.b.Create(context.Background(), name)
	if err != nil {
		f.t.Fatal(err)
	}
	return sb.(*opensandbox.Sandbox)
}

func (f *fixture) host(sb sandbox.Sandbox, inside string) string {
	rel, ok := strings.CutPrefix(inside, f.srv.MountPoint()+"/")
	if !ok {
		f.t.Fatalf("%s is not under the mount point", inside)
	}
	return filepath.Join(f.srv.HostPath(sb.ID()), rel)
}

func run(t *testing.T, sb sandbox.Sandbox, req sandbox.ExecRequest) sandbox.ExecResult {
	t.Helper()
	res, err := sb.Exec(context.Background(), req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return res
}

// TestExecArgvEnvDirAndExitCodes proves that a command runs in the
// sandbox with its argv, environment and folder, every word quoted (task
// text with $(...), backquotes, quotes and newlines reaches the command
// literally and runs nothing), and that exit codes, stdout, stderr and
// stdin come back.
func TestExecArgvEnvDirAndExitCodes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sb := f.create("exec")
	if sb.Workdir() != "/sandbox/work" || sb.Root() != "/sandbox/.ngharness" {
		t.Fatalf("workdir %s root %s", sb.Workdir(), sb.Root())
	}
	marker := filepath.Join(t.TempDir(), "pwned")
	hostile := fmt.Sprintf("$(touch %s) `touch %s` ' \" ; touch %s\nnext line", marker, marker, marker)
	res := run(t, sb, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", `printf '%s|%s|%s' "$1" "$V" "$(pwd)"; echo err >&2; exit 3`, "sh", hostile},
		Env:  map[string]string{"V": hostile},
	})
	want := hostile + "|" + hostile + "|/sandbox/work"
	if res.ExitCode != 3 || string(res.Stdout) != want || strings.TrimSpace(string(res.Stderr)) != "err" {
		t.Errorf("got exit %d stdout %q stderr %q, want 3 %q err", res.ExitCode, res.Stdout, res.Stderr, want)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("the task text ran a command: %s exists", marker)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("from stdin\n"), Dir: "/tmp"})
	if res.ExitCode != 0 || string(res.Stdout) != "from stdin\n" {
		t.Errorf("stdin: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}})
	if res.ExitCode != 128+15 {
		t.Errorf("a command killed by SIGTERM exited %d, want 143", res.ExitCode)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"pwd"}, Dir: "sub"})
	if res.ExitCode == 0 {
		t.Errorf("cd into a missing relative folder succeeded: %q", res.Stdout)
	}
	if _, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A B": "x"}}); err == nil {
		t.Errorf("an environment key with a space was accepted")
	}
	// Every command the backend sent was one quoted line under timeout(1).
	for _, c := range f.srv.Commands(sb.ID()) {
		if strings.Contains(c, "pwned") && !strings.Contains(c, "'") {
			t.Errorf("a command carried the task text unquoted: %q", c)
		}
	}
}

// TestExecTimeoutKillsInside proves that a command that outlives its
// timeout is killed inside the sandbox and reported as sandbox.ErrTimeout,
// and that nothing of it is left running.
func TestExecTimeoutKillsInside(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sb := f.create("timeout")
	_, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sleep", "300"}, Timeout: time.Second})
	if !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
	if !strings.Contains(err.Error(), sb.ID()) {
		t.Errorf("the error does not name the sandbox: %v", err)
	}
	sandboxtest.WaitNoProcs(t, f.srv.HostPath(sb.ID()), f.srv.MountPoint())
}

// TestUploadDownload proves that an upload lands with its mode in folders
// it makes (the metadata sent as a file part, as execd requires), replaces
// a file atomically, and that a download reads it back, in full or by
// range.
func TestUploadDownload(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sb := f.create("files")
	p := "/sandbox/.ngharness/bin/deep/tool"
	if err := sb.Upload(context.Background(), p, []byte("#!/bin/sh\necho tool\n"), 0o750); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(f.host(sb, p))
	if err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("uploaded file: %v %v", fi, err)
	}
	if res := run(t, sb, sandbox.ExecRequest{Argv: []string{p}}); string(res.Stdout) != "tool\n" {
		t.Errorf("the uploaded tool printed %q", res.Stdout)
	}
	if err := sb.Upload(context.Background(), p, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	data, err := sb.Download(context.Background(), p)
	if err != nil || string(data) != "0123456789" {
		t.Fatalf("download: %q %v", data, err)
	}
	ex, err := sb.Execd(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	part, err := ex.DownloadRange(context.Background(), p, 3, 4)
	if err != nil || string(part) != "3456" {
		t.Errorf("range: %q %v", part, err)
	}
	if _, err := sb.Download(context.Background(), "/sandbox/work/missing"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a missing file: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Dir(f.host(sb, p)))
	if len(ents) != 1 {
		t.Errorf("the upload left temporary files: %v", ents)
	}
	if err := sb.Upload(context.Background(), "relative/path", []byte("x"), 0o644); err == nil {
		t.Errorf("a relative upload path was accepted")
	}
}

// TestBackgroundCommands proves the background command API on execd's
// timing (a command unknown to status and interrupt for a while after its
// init): start, status asked again until execd knows the id, logs with a
// moving cursor, status reported late (the wait polls on) with the exit
// code, an interrupt sent right after the start that does end the command
// (execd reports it -1, as for every signal), an interrupt of a finished
// command that is no error, and ids forgotten (as after a restart of
// execd) reported as sandbox.ErrNotFound.
func TestBackgroundCommands(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, fakeexecd.Options{RegisterDelay: 300 * time.Millisecond}, opensandbox.Options{})
	sb := f.create("background")
	ex, err := sb.Execd(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f.srv.SetLateCompletion(time.Second)
	id, err := ex.Start(ctx, opensandbox.Command{Command: "echo one; sleep 0.3; echo two >&2; exit 4"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ex.Wait(ctx, id, 50*time.Millisecond)
	if err != nil || st.Running || st.ExitCode == nil || *st.ExitCode != 4 || st.FinishedAt == nil {
		t.Fatalf("status %+v %v", st, err)
	}
	if !st.FinishedAt.Before(time.Now().Add(-900 * time.Millisecond)) {
		t.Errorf("the status was not reported late: finished %s", st.FinishedAt)
	}
	logs, cursor, err := ex.Logs(ctx, id, 0)
	if err != nil || !strings.Contains(string(logs), "one") || !strings.Contains(string(logs), "two") || cursor != int64(len(logs)) {
		t.Fatalf("logs %q cursor %d %v", logs, cursor, err)
	}
	more, next, err := ex.Logs(ctx, id, cursor)
	if err != nil || len(more) != 0 || next != cursor {
		t.Errorf("logs after the cursor: %q %d %v", more, next, err)
	}
	f.srv.SetLateCompletion(0)

	id2, err := ex.Start(ctx, opensandbox.Command{Command: "exec sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ex.Interrupt(ctx, id2); err != nil {
		t.Fatal(err)
	}
	st, err = ex.Wait(ctx, id2, 50*time.Millisecond)
	if err != nil || st.ExitCode == nil || *st.ExitCode != -1 {
		t.Errorf("the interrupted command: %+v %v, want exit code -1", st, err)
	}
	if err := ex.Interrupt(ctx, id2); err != nil {
		t.Errorf("interrupt of a finished command: %v", err)
	}
	f.srv.ForgetCommandIDs()
	if _, err := ex.Status(ctx, id); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("status of a forgotten id: %v", err)
	}
	if _, _, err := ex.Logs(ctx, id, 0); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("logs of a forgotten id: %v", err)
	}
	if err := ex.Interrupt(ctx, id); err != nil {
		t.Errorf("interrupt of a forgotten id (execd: 500 no such session): %v", err)
	}
}

// TestExecdRestartAndDroppedStreams proves the transport classes: a
// command whose stream is cut (execd restarting, or the connection
// dropped before or after the command ran) is sandbox.ErrTransport and is
// not sent again by the backend (it ran at most once); a command sent
// while execd is down is sent once it is back (it had not reached it).
func TestExecdRestartAndDroppedStreams(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sb := f.create("restart")
	ctx := context.Background()

	var wg sync.WaitGroup
	var longErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, longErr = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo started >>count; sleep 300"}})
	}()
	testkit.Eventually(t, "the long command to start", func() (bool, string) {
		data, _ := os.ReadFile(f.host(sb, "/sandbox/work/count"))
		return len(data) > 0, ""
	})
	restarted := make(chan error, 1)
	go func() { restarted <- f.srv.RestartExecd(sb.ID(), time.Second) }()
	wg.Wait()
	if !errors.Is(longErr, sandbox.ErrTransport) || opensandbox.NotSent(longErr) {
		t.Errorf("a command whose stream the restart cut: %v, want a sent ErrTransport", longErr)
	}
	// Sent while execd is down (or just back): it runs, once.
	res := run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo after >>count"}})
	if res.ExitCode != 0 {
		t.Errorf("exec after the restart: %+v", res)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(f.host(sb, "/sandbox/work/count"))
	if string(data) != "started\nafter\n" {
		t.Errorf("count holds %q: each command must run exactly once", data)
	}

	for _, when := range []fakeexecd.DropPoint{fakeexecd.DropAfterInit, fakeexecd.DropBeforeEnd} {
		word := fmt.Sprintf("drop%d", when)
		f.srv.DropStreams(func(c string) bool { return strings.Contains(c, word) }, 1, when)
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo " + word + " >>dropped"}})
		if !errors.Is(err, sandbox.ErrTransport) || opensandbox.NotSent(err) {
			t.Errorf("%s: a dropped stream gave %v, want a sent ErrTransport", word, err)
		}
	}
	data, _ = os.ReadFile(f.host(sb, "/sandbox/work/dropped"))
	if n := strings.Count(string(data), "drop"); n > 2 || !strings.Contains(string(data), "drop1") {
		t.Errorf("dropped holds %q: the command dropped before its end ran once, none ran twice", data)
	}
	sandboxtest.WaitNoProcs(t, f.srv.HostPath(sb.ID()), f.srv.MountPoint())
}

// TestLifecycleSnapshotForkRemoveRenew proves the owner's side: a sandbox
// made from the image runs with its folders; a snapshot (polled until
// ready) forks into a new sandbox with the same files at the same paths;
// renew moves the expiration; a removed sandbox is sandbox.ErrGone for
// every call, naming it; removing twice is fine; a snapshot a fork still
// uses is sandbox.ErrSnapshotInUse naming the fork (the server keeps it,
// Deleting, and makes no fork of it), and the same remove succeeds once
// the fork is gone.
func TestLifecycleSnapshotForkRemoveRenew(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	sb := f.create("origin")
	if f.srv.Name(sb.ID()) != "origin" {
		t.Errorf("the sandbox's name is %q", f.srv.Name(sb.ID()))
	}
	run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo kept > file"}})
	snap, err := f.b.Snapshot(ctx, sb.ID(), "ckpt-1")
	if err != nil {
		t.Fatal(err)
	}
	fork, err := f.b.Fork(ctx, snap, "fork")
	if err != nil {
		t.Fatal(err)
	}
	if fork.ID() == sb.ID() {
		t.Fatalf("the fork has the id of its origin")
	}
	if res := run(t, fork, sandbox.ExecRequest{Argv: []string{"cat", "/sandbox/work/file"}}); string(res.Stdout) != "kept\n" {
		t.Errorf("the fork's file: %q", res.Stdout)
	}
	if err := f.b.Renew(ctx, fork.ID(), 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	if r := f.srv.Renewals(fork.ID()); len(r) != 1 || r[0].Before(time.Now().Add(time.Hour)) {
		t.Errorf("renewals %v", r)
	}
	if err := f.b.Remove(ctx, sb.ID()); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Remove(ctx, sb.ID()); err != nil {
		t.Errorf("removing a removed sandbox: %v", err)
	}
	_, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
	if !errors.Is(err, sandbox.ErrGone) || !strings.Contains(err.Error(), sb.ID()) {
		t.Errorf("exec in a removed sandbox: %v", err)
	}
	if err := sb.Upload(ctx, "/sandbox/work/x", []byte("x"), 0o644); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("upload to a removed sandbox: %v", err)
	}
	if _, err := f.b.Open(ctx, sb.ID()); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("open a removed sandbox: %v", err)
	}
	if _, err := f.b.Connect(ctx, sandbox.Descriptor{Provider: "opensandbox", SandboxID: sb.ID()}); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("connect to a removed sandbox: %v", err)
	}
	// The fork still uses the snapshot: the server keeps it (Deleting)
	// until the fork is gone.
	if err := f.b.RemoveSnapshot(ctx, snap); !errors.Is(err, sandbox.ErrSnapshotInUse) || !strings.Contains(err.Error(), fork.ID()) {
		t.Fatalf("remove the snapshot a fork uses: %v, want ErrSnapshotInUse naming the fork %s", err, fork.ID())
	}
	if st := f.srv.SnapshotState(snap); st != opensandbox.SnapshotDeleting {
		t.Errorf("the snapshot a fork uses is %q after its delete, want Deleting", st)
	}
	if _, err := f.b.Fork(ctx, snap, "late"); err == nil {
		t.Errorf("a fork of a snapshot being deleted succeeded")
	}
	if res := run(t, fork, sandbox.ExecRequest{Argv: []string{"cat", "/sandbox/work/file"}}); string(res.Stdout) != "kept\n" {
		t.Errorf("the fork after its snapshot's delete: %q", res.Stdout)
	}
	second, err := f.b.Fork(ctx, func() string {
		s2, err := f.b.Snapshot(ctx, fork.ID(), "of-the-fork")
		if err != nil {
			t.Fatal(err)
		}
		return s2
	}(), "second")
	if err != nil {
		t.Fatal(err)
	}
	bad, err := opensandbox.New(opensandbox.Options{Server: f.srv.URL(), Image: "fail-image", Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Create(ctx, "x"); err == nil {
		t.Errorf("a sandbox without the API key was created")
	} else if !errors.Is(err, sandbox.ErrUnauthorized) {
		t.Errorf("a wrong API key: %v, want ErrUnauthorized", err)
	}
	failing, _ := opensandbox.New(opensandbox.Options{Server: f.srv.URL(), APIKey: apiKey, Image: "fail-image", Poll: 20 * time.Millisecond})
	if _, err := failing.Create(ctx, "x"); err == nil || !strings.Contains(err.Error(), "Failed") {
		t.Errorf("a sandbox that fails to start: %v", err)
	}
	if left := f.srv.Sandboxes(); len(left) != 2 || !slices.Contains(left, fork.ID()) || !slices.Contains(left, second.ID()) {
		t.Errorf("sandboxes left %v, want only the fork %s and its own fork %s", left, fork.ID(), second.ID())
	}
	// Once the fork is gone the same delete removes the snapshot.
	if err := f.b.Remove(ctx, fork.ID()); err != nil {
		t.Fatal(err)
	}
	if err := f.b.RemoveSnapshot(ctx, snap); err != nil {
		t.Errorf("remove the snapshot once its fork is gone: %v", err)
	}
	if err := f.b.RemoveSnapshot(ctx, snap); err != nil {
		t.Errorf("removing a removed snapshot: %v", err)
	}
	if left := f.srv.Snapshots(); len(left) != 1 {
		t.Errorf("snapshots left %v, want only the one the second fork uses", left)
	}
}

// TestEndpointShapes proves the backend reaches execd through either
// shape of the endpoint lookup: the Docker runtime's
// host:port/proxy/44772 with no header, and the Kubernetes runtime's
// host:port with OpenSandbox-Secure-Access, without which execd refuses
// (401 {"error": ...}: sandbox.ErrUnauthorized, its message kept).
func TestEndpointShapes(t *testing.T) {
	t.Parallel()
	for _, rt := range []fakeexecd.Runtime{fakeexecd.RuntimeDocker, fakeexecd.RuntimeKubernetes} {
		f := newFixtureWith(t, fakeexecd.Options{Runtime: rt}, opensandbox.Options{})
		sb := f.create("shape")
		ep, err := f.b.Lifecycle().Endpoint(context.Background(), sb.ID(), opensandbox.ExecdPort, false)
		if err != nil {
			t.Fatal(err)
		}
		if res := run(t, sb, sandbox.ExecRequest{Argv: []string{"echo", "hi"}}); string(res.Stdout) != "hi\n" {
			t.Errorf("runtime %d: exec printed %q", rt, res.Stdout)
		}
		if rt == fakeexecd.RuntimeDocker {
			if !strings.HasSuffix(ep.URL, "/proxy/44772") || len(ep.Headers) != 0 {
				t.Errorf("docker endpoint %+v", ep)
			}
			continue
		}
		if strings.Contains(ep.URL, "://") || ep.Headers[opensandbox.SecureAccessHeader] == "" {
			t.Errorf("kubernetes endpoint %+v: want host:port and the header", ep)
		}
		ex := &opensandbox.Execd{URL: ep.URL}
		_, err = ex.Run(context.Background(), opensandbox.Command{Command: "true"}, nil)
		if !errors.Is(err, sandbox.ErrUnauthorized) || !strings.Contains(err.Error(), "Unauthorized") {
			t.Errorf("no header: %v", err)
		}
		ex.Headers = ep.Headers
		if err := ex.Ping(context.Background()); err != nil {
			t.Errorf("ping with the header: %v", err)
		}
	}
}

// TestReadEventsFraming proves the event parser reads JSON events
// separated by blank lines, SSE data: framing, and one event per line.
func TestReadEventsFraming(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"blank lines": "{\"type\":\"init\",\"text\":\"c1\"}\n\n{\"type\":\"stdout\",\"text\":\"a\\n\"}\n\n{\"type\":\"error\",\"error\":{\"ename\":\"E\",\"evalue\":\"7\"}}\n\n",
		"sse":         ": hello\nevent: init\ndata: {\"type\":\"init\",\"text\":\"c1\"}\n\ndata: {\"type\":\"stdout\",\ndata: \"text\":\"a\\n\"}\n\ndata: {\"type\":\"error\",\"error\":{\"evalue\":\"7\"}}\n\n",
		"lines":       "{\"type\":\"init\",\"text\":\"c1\"}\n{\"type\":\"stdout\",\"text\":\"a\\n\"}\n{\"type\":\"error\",\"error\":{\"evalue\":\"7\"}}",
	} {
		res, err := opensandbox.ParseStream(strings.NewReader(body))
		if err != nil || res.ID != "c1" || string(res.Stdout) != "a\n" || res.ExitCode != 7 {
			t.Errorf("%s: %+v %v", name, res, err)
		}
	}
	if _, err := opensandbox.ParseStream(strings.NewReader("{\"type\":\"init\",\"text\":\"c1\"}\n\n")); !errors.Is(err, sandbox.ErrTransport) {
		t.Errorf("a stream without its end: %v", err)
	}
	if _, err := opensandbox.ParseStream(bytes.NewReader([]byte("not json\n\n"))); err == nil {
		t.Errorf("a stream that is not JSON was accepted")
	}
}

// countingTransport counts the large uploads in flight and holds each
// until more than limit are in flight or a second has passed, so that
// uploads a backend lets run together overlap.
type countingTransport struct {
	next        http.RoundTripper
	limit       int32
	now, most   atomic.Int32
	over        chan struct{}
	overOnce    sync.Once
	small, seen atomic.Int32
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.URL.Path, "/files/upload") {
		return c.next.RoundTrip(req)
	}
	if req.ContentLength < opensandbox.LargeUpload {
		c.small.Add(1)
		return c.next.RoundTrip(req)
	}
	c.seen.Add(1)
	n := c.now.Add(1)
	defer c.now.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	if n > c.limit {
		c.overOnce.Do(func() { close(c.over) })
	}
	select {
	case <-c.over:
	case <-time.After(time.Second):
	case <-req.Context().Done():
	}
	return c.next.RoundTrip(req)
}

// TestLargeUploadsBounded proves that uploads of LargeUpload bytes or
// more run at most MaxUploads at once across the backend's sandboxes
// (ngsup, 3.5 MB, uploaded to hundreds of sandboxes at once held 535 MB
// in the driver), that each arrives byte for byte from the streamed body,
// and that small uploads (a command's stdin) are not held back by them.
func TestLargeUploadsBounded(t *testing.T) {
	t.Parallel()
	ct := &countingTransport{next: http.DefaultTransport.(*http.Transport).Clone(), limit: 2, over: make(chan struct{})}
	f := newFixtureWith(t, fakeexecd.Options{}, opensandbox.Options{MaxUploads: 2, HTTP: &http.Client{Transport: ct}})
	sbs := []*opensandbox.Sandbox{f.create("up-a"), f.create("up-b")}
	big := make([]byte, opensandbox.LargeUpload+12345)
	rand.Read(big)
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = sbs[i%2].Upload(context.Background(), fmt.Sprintf("/sandbox/work/big-%d", i), big, 0o755)
		})
	}
	// A command with stdin (a small upload) while the large ones queue.
	res := run(t, sbs[0], sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("small")})
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("upload %d: %v", i, err)
		}
	}
	if string(res.Stdout) != "small" || ct.small.Load() == 0 {
		t.Errorf("the command with stdin printed %q (%d small uploads)", res.Stdout, ct.small.Load())
	}
	if m := ct.most.Load(); m > 2 || ct.seen.Load() != n {
		t.Errorf("%d large uploads ran at once, want at most 2 (MaxUploads); %d seen, want %d", m, ct.seen.Load(), n)
	}
	for i := range n {
		got, err := os.ReadFile(f.host(sbs[i%2], fmt.Sprintf("/sandbox/work/big-%d", i)))
		if err != nil || !bytes.Equal(got, big) {
			t.Errorf("big-%d: %d bytes (%v), want the %d uploaded", i, len(got), err, len(big))
		}
	}
}
