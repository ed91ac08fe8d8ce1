package execd_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
)

const key = "k"

// fx is a fake OpenSandbox with one sandbox, reached over raw HTTP.
type fx struct {
	t        *testing.T
	srv      *execd.Server
	id       string
	endpoint string
	headers  map[string]string
}

func start(t *testing.T, opt execd.Options) *fx {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the fake execd runs commands in mount namespaces of their own: it needs root")
	}
	opt.Base, opt.APIKey = t.TempDir(), key
	srv, err := execd.Start(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	f := &fx{t: t, srv: srv}
	resp, data := f.call("POST", srv.URL()+"/v1/sandboxes", key, strings.NewReader(`{"image":{"uri":"x"}}`), nil)
	var sb struct{ ID string }
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(data, &sb) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, data)
	}
	f.id = sb.ID
	resp, data = f.call("GET", srv.URL()+"/v1/sandboxes/"+sb.ID+"/endpoints/44772", key, nil, nil)
	var ep struct {
		Endpoint string
		Headers  map[string]string
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &ep) != nil {
		t.Fatalf("endpoint: %d %s", resp.StatusCode, data)
	}
	f.endpoint, f.headers = "http://"+ep.Endpoint, ep.Headers
	f.waitExecd()
	return f
}

// waitExecd waits until execd answers GET /ping: a new sandbox reports
// Running before execd listens, as the real server's do. It returns how
// many pings failed first, and how.
func (f *fx) waitExecd() (failed []error) {
	f.t.Helper()
	testkit.Eventually(f.t, "execd answers its ping", func() (bool, string) {
		req, _ := http.NewRequest("GET", f.endpoint+"/ping", nil)
		for k, v := range f.headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true, ""
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		failed = append(failed, err)
		return false, fmt.Sprint(failed)
	})
	return failed
}

func (f *fx) call(method, url, apiKey string, body io.Reader, header map[string]string) (*http.Response, []byte) {
	f.t.Helper()
	req, _ := http.NewRequest(method, url, body)
	if apiKey != "" {
		req.Header.Set(execd.APIKeyHeader, apiKey)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, data
}

// execd calls execd with the headers the endpoint lookup named.
func (f *fx) execd(method, p string, body io.Reader) (*http.Response, []byte) {
	f.t.Helper()
	return f.call(method, f.endpoint+p, "", body, f.headers)
}

type ev struct {
	Type  string
	Text  string
	Error struct {
		EName     string
		EValue    string
		Traceback []string
	}
	at time.Time
}

// run posts a command and reads its whole stream; closed is when the
// stream ended.
func (f *fx) run(cmd map[string]any) (evs []ev, closed time.Time) {
	f.t.Helper()
	body, _ := json.Marshal(cmd)
	req, _ := http.NewRequest("POST", f.endpoint+"/command", bytes.NewReader(body))
	for k, v := range f.headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		f.t.Fatalf("POST /command: %d %s", resp.StatusCode, data)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var e ev
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			f.t.Fatalf("an event that is not JSON: %q", sc.Bytes())
		}
		e.at = time.Now()
		evs = append(evs, e)
	}
	return evs, time.Now()
}

func texts(evs []ev, kind string) []string {
	var out []string
	for _, e := range evs {
		if e.Type == kind {
			out = append(out, e.Text)
		}
	}
	return out
}

func last(evs []ev) ev {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type != "ping" {
			return evs[i]
		}
	}
	return ev{}
}

// TestOutputIsReChunkedByLine proves the output events are execd's: one
// per line with "\n" and "\r" dropped (printf 'a\nb\n\nc\r\nd' arrives as
// "a", "b", "\n", "c", "d", joined "ab\ncd"), a line written in pieces
// arrives whole, invalid UTF-8 arrives as U+FFFD, and a zero exit ends
// with execution_complete.
func TestOutputIsReChunkedByLine(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1})
	evs, _ := f.run(map[string]any{"command": `printf 'a\nb\n\nc\r\nd'; printf 'x\377y\n' >&2; printf 'par'; sleep 0.3; printf 'ts\n'`})
	out := texts(evs, "stdout")
	want := []string{"a", "b", "\n", "c", "dpar" + "ts"}
	if strings.Join(out, "|") != strings.Join(want, "|") {
		t.Errorf("stdout events %q, want %q", out, want)
	}
	if got := strings.Join(texts(evs, "stderr"), ""); got != "x\uFFFDy" {
		t.Errorf("stderr %q, want invalid UTF-8 as U+FFFD", got)
	}
	if evs[0].Type != "init" || evs[0].Text == "" || last(evs).Type != "execution_complete" {
		t.Errorf("events %+v: want init first and execution_complete last", evs)
	}
}

// TestStreamLingersAndPings proves the stream sends a ping right after
// init and every PingInterval, and closes only GracefulDelay after the
// final event.
func TestStreamLingersAndPings(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: 700 * time.Millisecond, PingInterval: 200 * time.Millisecond})
	evs, closed := f.run(map[string]any{"command": "sleep 0.5"})
	if len(evs) < 2 || evs[1].Type != "ping" {
		t.Errorf("events %+v: want a ping right after init", evs)
	}
	if n := len(texts(evs, "ping")); n < 3 {
		t.Errorf("%d pings over 0.5 s at 200 ms, want at least 3", n)
	}
	end := last(evs)
	if end.Type != "execution_complete" {
		t.Fatalf("the last event is %+v", end)
	}
	if d := closed.Sub(end.at); d < 600*time.Millisecond {
		t.Errorf("the stream closed %s after the final event, want the graceful delay (700 ms)", d)
	}
}

// TestExitReports proves how an end is reported: a non-zero exit as an
// error event with the code; a signal as evalue "-1" with the signal's
// name in the traceback; execd's own timeout as CommandExecError "-1"
// "signal: killed".
func TestExitReports(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1})
	for _, c := range []struct {
		cmd        string
		timeout    int
		evalue, tb string
	}{
		{"exit 3", 0, "3", "exit status 3"},
		{"kill -KILL $$", 0, "-1", "signal: killed"},
		{"kill -TERM $$", 0, "-1", "signal: terminated"},
		{"sleep 5", 300, "-1", "signal: killed"},
	} {
		evs, _ := f.run(map[string]any{"command": c.cmd, "timeout": c.timeout})
		e := last(evs)
		if e.Type != "error" || e.Error.EName != "CommandExecError" || e.Error.EValue != c.evalue || len(e.Error.Traceback) != 1 || e.Error.Traceback[0] != c.tb {
			t.Errorf("%q: %+v, want CommandExecError %s %q", c.cmd, e, c.evalue, c.tb)
		}
	}
}

// TestDisconnectDoesNotEndTheCommand proves a foreground command goes on
// after its client went away.
func TestDisconnectDoesNotEndTheCommand(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	body, _ := json.Marshal(map[string]any{"command": "sleep 1; touch " + f.srv.MountPoint() + "/after"})
	req, _ := http.NewRequestWithContext(ctx, "POST", f.endpoint+"/command", bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.Contains(line, `"init"`) {
		t.Fatalf("first event %q", line)
	}
	cancel()
	resp.Body.Close()
	testkit.Eventually(t, "the command outlives its client", func() (bool, string) {
		_, err := os.Stat(filepath.Join(f.srv.HostPath(f.id), "after"))
		return err == nil, fmt.Sprint(err)
	})
}

// TestBackgroundAndInterrupt proves a background command is unknown to
// the status endpoint right after its init (404), then known; that an
// interrupt of an unknown or finished id is 500 "no such session"; and
// that an interrupt blocks its grace (TERM, then KILL) before it answers,
// the command then reported as killed (exit_code -1).
func TestBackgroundAndInterrupt(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1, RegisterDelay: 300 * time.Millisecond, InterruptGrace: 500 * time.Millisecond})
	evs, _ := f.run(map[string]any{"command": "trap '' TERM; sleep 30", "background": true})
	id := evs[0].Text
	if evs[0].Type != "init" || last(evs).Type != "execution_complete" {
		t.Fatalf("background events %+v", evs)
	}
	if resp, _ := f.execd("GET", "/command/status/"+id, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("status right after init: %d, want 404", resp.StatusCode)
	}
	time.Sleep(400 * time.Millisecond)
	resp, data := f.execd("GET", "/command/status/"+id, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"running":true`) {
		t.Fatalf("status once registered: %d %s", resp.StatusCode, data)
	}
	t0 := time.Now()
	if resp, data := f.execd("DELETE", "/command?id="+id, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("interrupt: %d %s", resp.StatusCode, data)
	}
	if d := time.Since(t0); d < 450*time.Millisecond {
		t.Errorf("the interrupt answered after %s, want it to block its grace (500 ms)", d)
	}
	testkit.Eventually(t, "the interrupted command ends", func() (bool, string) {
		_, data = f.execd("GET", "/command/status/"+id, nil)
		return strings.Contains(string(data), `"running":false`), string(data)
	})
	if !strings.Contains(string(data), `"exit_code":-1`) {
		t.Errorf("the interrupted command: %s, want exit_code -1", data)
	}
	for _, bad := range []string{id, "cmd-unknown"} {
		resp, data := f.execd("DELETE", "/command?id="+bad, nil)
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(data), "no such session") {
			t.Errorf("interrupt of %s: %d %s, want 500 no such session", bad, resp.StatusCode, data)
		}
	}
}

// TestCommandsInheritExecdsEnvironment proves a command sees execd's whole
// environment plus its envs.
func TestCommandsInheritExecdsEnvironment(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1, Env: []string{"PATH=" + os.Getenv("PATH"), "EXECD_OWN=from-execd"}})
	evs, _ := f.run(map[string]any{"command": `echo "$EXECD_OWN $MINE"`, "envs": map[string]string{"MINE": "mine"}})
	if got := strings.Join(texts(evs, "stdout"), ""); got != "from-execd mine" {
		t.Errorf("stdout %q", got)
	}
}

// TestEndpointShapes proves both runtimes' endpoints: Docker's
// host:port/proxy/44772 with no header (execd's proxy path and its own
// paths both serve), Kubernetes' host:port with OpenSandbox-Secure-Access,
// without which execd answers 401 {"error": ...}.
func TestEndpointShapes(t *testing.T) {
	t.Parallel()
	d := start(t, execd.Options{GracefulDelay: -1})
	if !strings.HasSuffix(d.endpoint, "/proxy/44772") || len(d.headers) != 0 {
		t.Errorf("docker endpoint %s %v", d.endpoint, d.headers)
	}
	if resp, _ := d.execd("GET", "/ping", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("ping through the proxy path: %d", resp.StatusCode)
	}
	if resp, _ := d.call("GET", strings.TrimSuffix(d.endpoint, "/proxy/44772")+"/ping", "", nil, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("ping at execd's own path: %d", resp.StatusCode)
	}
	k := start(t, execd.Options{GracefulDelay: -1, Runtime: execd.RuntimeKubernetes})
	if strings.Contains(k.endpoint, "/proxy/") || k.headers[execd.SecureAccessHeader] == "" {
		t.Errorf("kubernetes endpoint %s %v", k.endpoint, k.headers)
	}
	resp, data := k.call("GET", k.endpoint+"/ping", "", nil, nil)
	var body struct{ Error string }
	if resp.StatusCode != http.StatusUnauthorized || json.Unmarshal(data, &body) != nil || body.Error == "" {
		t.Errorf("no header: %d %s, want 401 {\"error\": ...}", resp.StatusCode, data)
	}
	if resp, _ := k.execd("GET", "/ping", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("ping with the header: %d", resp.StatusCode)
	}
}

// TestFakeIsStrictWhereExecdIs proves the fake refuses what the real
// services refuse: a lifecycle call without the API key (401), and an
// upload whose metadata is a plain form field instead of a file part
// (400).
func TestFakeIsStrictWhereExecdIs(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{})
	resp, _ := f.call("POST", f.srv.URL()+"/v1/sandboxes", "", strings.NewReader(`{"image":{"uri":"x"}}`), nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no API key: %d", resp.StatusCode)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("metadata", `{"path":"/sandbox/work/f","mode":644}`)
	fw, _ := mw.CreateFormFile("file", "f")
	fw.Write([]byte("x"))
	mw.Close()
	resp, data := f.call("POST", f.endpoint+"/files/upload", "", &body, map[string]string{"Content-Type": mw.FormDataContentType()})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), "file part") {
		t.Errorf("metadata as a plain field: %d %s", resp.StatusCode, data)
	}
}

// lifecycle calls the lifecycle server with the API key and decodes its
// JSON reply into out (when given); it returns the status.
func (f *fx) lifecycle(method, p string, body any, out any) int {
	f.t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	resp, data := f.call(method, f.srv.URL()+"/v1"+p, key, rd, nil)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			f.t.Fatalf("%s %s: %d %s: %v", method, p, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

type sandboxReply struct {
	ID     string
	Status struct{ State, Reason, Message string }
}

type snapshotReply struct {
	ID, SandboxID string
	Status        struct{ State string }
	Code, Message string
}

// pingOnce sends one GET /ping on a connection of its own.
func (f *fx) pingOnce() error {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", f.endpoint+"/ping", nil)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

// TestCreateReportsRunningBeforeExecdListens proves the create-then-listen
// window of the real server: the create's answer already says Running,
// and for ListenAfter connections to execd are accepted and dropped (an
// end of file or a reset, never "connection refused") before its ping
// answers.
func TestCreateReportsRunningBeforeExecdListens(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1, ListenAfter: 2 * time.Second})
	var sb sandboxReply
	if code := f.lifecycle("POST", "/sandboxes", map[string]any{"image": map[string]string{"uri": "x"}}, &sb); code != http.StatusAccepted || sb.Status.State != "Running" {
		t.Fatalf("create: %d %+v, want 202 Running", code, sb)
	}
	var ep struct{ Endpoint string }
	f.lifecycle("GET", "/sandboxes/"+sb.ID+"/endpoints/44772", nil, &ep)
	g := &fx{t: t, srv: f.srv, id: sb.ID, endpoint: "http://" + ep.Endpoint}
	err := g.pingOnce()
	if err == nil {
		t.Fatalf("execd answered at once")
	}
	failed := g.waitExecd()
	for _, e := range append(failed, err) {
		if strings.Contains(e.Error(), "refused") {
			t.Errorf("a connection in the window was refused (%v): the real one accepts and drops", e)
		}
	}
	t.Logf("%d pings failed before execd answered, the first with %v", len(failed)+1, err)
}

// TestDeleteAnswersFailedBeforeGone proves a delete as the real server's:
// the processes are killed, GET answers 200 with state Failed
// (CONTAINER_EXITED_ERROR) and connections to execd are accepted and
// dropped for FailedFor, then GET answers 404 and connections are refused.
func TestDeleteAnswersFailedBeforeGone(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1, FailedFor: 2 * time.Second})
	deleted := make(chan int, 1)
	go func() { deleted <- f.lifecycle("DELETE", "/sandboxes/"+f.id, nil, nil) }()
	var sb sandboxReply
	testkit.Eventually(t, "the sandbox to say Failed", func() (bool, string) {
		f.lifecycle("GET", "/sandboxes/"+f.id, nil, &sb)
		return sb.Status.State == "Failed", ""
	})
	if sb.Status.Reason != "CONTAINER_EXITED_ERROR" {
		t.Errorf("the deleted sandbox says %+v", sb.Status)
	}
	if err := f.pingOnce(); err == nil || strings.Contains(err.Error(), "refused") {
		t.Errorf("execd of a sandbox in the Failed window: %v, want the connection dropped", err)
	}
	if code := <-deleted; code != http.StatusNoContent {
		t.Errorf("delete: %d", code)
	}
	if code := f.lifecycle("GET", "/sandboxes/"+f.id, nil, nil); code != http.StatusNotFound {
		t.Errorf("GET after the delete: %d, want 404", code)
	}
	if err := f.pingOnce(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("execd of a removed sandbox: %v, want refused", err)
	}
}

// snapshot takes a snapshot of the sandbox and waits until it is Ready.
func (f *fx) snapshot(name string) string {
	f.t.Helper()
	var sn snapshotReply
	if code := f.lifecycle("POST", "/sandboxes/"+f.id+"/snapshots", map[string]string{"name": name}, &sn); code != http.StatusAccepted || sn.Status.State != "Creating" {
		f.t.Fatalf("snapshot: %d %+v", code, sn)
	}
	testkit.Eventually(f.t, "the snapshot to be ready", func() (bool, string) {
		f.lifecycle("GET", "/snapshots/"+sn.ID, nil, &sn)
		return sn.Status.State == "Ready", ""
	})
	return sn.ID
}

// TestSnapshotAForkUsesIsNotDeleted proves the real server's rule: a
// snapshot whose fork exists answers its delete with 409
// SNAPSHOT::DELETE_CONFLICT and stays, Deleting (no fork of it can be
// made); once the fork is gone the same delete answers 204. A second
// snapshot of the same name is a new one.
func TestSnapshotAForkUsesIsNotDeleted(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1, SnapshotWork: 50 * time.Millisecond})
	snap := f.snapshot("same")
	if again := f.snapshot("same"); again == snap {
		t.Errorf("a second snapshot of the same name has the first's id")
	}
	var fork sandboxReply
	if code := f.lifecycle("POST", "/sandboxes", map[string]any{"snapshotId": snap}, &fork); code != http.StatusAccepted {
		t.Fatalf("fork: %d", code)
	}
	var sn snapshotReply
	if code := f.lifecycle("DELETE", "/snapshots/"+snap, nil, &sn); code != http.StatusConflict || sn.Code != "SNAPSHOT::DELETE_CONFLICT" || !strings.Contains(sn.Message, fork.ID) {
		t.Fatalf("delete a snapshot a fork uses: %d %+v, want 409 SNAPSHOT::DELETE_CONFLICT naming %s", code, sn, fork.ID)
	}
	f.lifecycle("GET", "/snapshots/"+snap, nil, &sn)
	if sn.Status.State != "Deleting" {
		t.Errorf("the snapshot is %q, want Deleting", sn.Status.State)
	}
	if code := f.lifecycle("POST", "/sandboxes", map[string]any{"snapshotId": snap}, nil); code == http.StatusAccepted {
		t.Errorf("a fork of a Deleting snapshot was made")
	}
	if code := f.lifecycle("DELETE", "/sandboxes/"+fork.ID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete the fork: %d", code)
	}
	if code := f.lifecycle("DELETE", "/snapshots/"+snap, nil, nil); code != http.StatusNoContent {
		t.Errorf("the same delete once the fork is gone: %d, want 204", code)
	}
	if code := f.lifecycle("GET", "/snapshots/"+snap, nil, nil); code != http.StatusNotFound {
		t.Errorf("GET the deleted snapshot: %d", code)
	}
}

// TestSnapshotFreezesTheSandbox proves a snapshot pauses the whole
// sandbox for as long as it takes, as the Docker runtime's commit does:
// every process stopped (one stopped before is left stopped after), an
// exec sent meanwhile runs only after the thaw, and a command stream in
// flight at the thaw ends there, cleanly, without its final event (its
// command goes on and finishes).
func TestSnapshotFreezesTheSandbox(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1, SnapshotWork: 1500 * time.Millisecond})
	mp := f.srv.MountPoint()
	f.run(map[string]any{"command": "sleep 300 & echo $! > " + mp + "/running; setsid sh -c 'kill -STOP $$; exec sleep 300' </dev/null >/dev/null 2>&1 & echo $! > " + mp + "/stopped", "background": true})
	pidOf := func(name string) int {
		var pid int
		testkit.Eventually(t, name+"'s pid", func() (bool, string) {
			data, _ := os.ReadFile(filepath.Join(f.srv.HostPath(f.id), name))
			_, err := fmt.Sscan(string(data), &pid)
			return err == nil && pid > 0, ""
		})
		return pid
	}
	// The stopped one is in a session of its own: stopped in a group left
	// orphaned it would get SIGHUP and SIGCONT.
	running, stopped := pidOf("running"), pidOf("stopped")
	testkit.Eventually(t, "the stopped one to stop", func() (bool, string) { return proctest.State(stopped) == 'T', "" })
	// The command in flight ends only once the test lets it, after the
	// freeze: so it is in flight at the thaw however slow the machine (a
	// one-second sleep once ended before the snapshot froze it, in CI).
	inFlight := make(chan []ev, 1)
	go func() {
		evs, _ := f.run(map[string]any{"command": "echo > " + mp + "/in-flight-started; while [ ! -e " + mp + "/may-end ]; do sleep 0.02; done; echo finished > " + mp + "/in-flight"})
		inFlight <- evs
	}()
	testkit.Eventually(t, "the command in flight to start", func() (bool, string) {
		_, err := os.Stat(filepath.Join(f.srv.HostPath(f.id), "in-flight-started"))
		return err == nil, ""
	})
	var sn snapshotReply
	f.lifecycle("POST", "/sandboxes/"+f.id+"/snapshots", map[string]string{"name": "freeze"}, &sn)
	testkit.Eventually(t, "the freeze", func() (bool, string) { return proctest.State(running) == 'T', "" })
	if err := os.WriteFile(filepath.Join(f.srv.HostPath(f.id), "may-end"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	afterc := make(chan []ev, 1)
	go func() {
		evs, _ := f.run(map[string]any{"command": "date +%s%N"})
		afterc <- evs
	}()
	testkit.Eventually(t, "the snapshot to be ready", func() (bool, string) {
		f.lifecycle("GET", "/snapshots/"+sn.ID, nil, &sn)
		return sn.Status.State == "Ready", ""
	})
	fz := f.srv.Freezes()
	if len(fz) != 1 || fz[0].Processes < 2 {
		t.Fatalf("freezes %+v, want one that stopped the sandbox's processes", fz)
	}
	testkit.Eventually(t, "the thaw", func() (bool, string) { return proctest.State(running) != 'T', "" })
	if st := proctest.State(stopped); st != 'T' {
		t.Errorf("the process stopped before the snapshot is %c after it, want still T", st)
	}
	evs := <-inFlight
	for _, e := range evs {
		if e.Type == "execution_complete" || e.Type == "error" {
			t.Errorf("the stream in flight at the thaw ended with its final event: %+v", evs)
		}
	}
	testkit.Eventually(t, "the command in flight to finish", func() (bool, string) {
		_, err := os.Stat(filepath.Join(f.srv.HostPath(f.id), "in-flight"))
		return err == nil, ""
	})
	after := <-afterc
	var ns int64
	fmt.Sscan(strings.Join(texts(after, "stdout"), ""), &ns)
	if ran := time.Unix(0, ns); ran.Before(fz[0].End) {
		t.Errorf("the exec sent during the freeze ran at %s, before the thaw at %s", ran, fz[0].End)
	}
}

// TestEndStreamsEndsWithoutTheFinalEvent proves the fault mode EndStreams:
// the stream ends as a complete reply but without the command's final
// event, right after init (the command goes on) or once the command has
// finished and its output was sent.
func TestEndStreamsEndsWithoutTheFinalEvent(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1})
	mp := f.srv.MountPoint()
	f.srv.EndStreams(func(c string) bool { return strings.Contains(c, "early") }, 1, execd.DropAfterInit)
	f.srv.EndStreams(func(c string) bool { return strings.Contains(c, "late") }, 1, execd.DropBeforeEnd)
	evs, _ := f.run(map[string]any{"command": "sleep 0.3; echo early > " + mp + "/early"})
	if last(evs).Type != "init" {
		t.Errorf("early: events %+v, want init and no more", evs)
	}
	testkit.Eventually(t, "the early command to finish", func() (bool, string) {
		_, err := os.Stat(filepath.Join(f.srv.HostPath(f.id), "early"))
		return err == nil, ""
	})
	evs, _ = f.run(map[string]any{"command": "echo late; exit 3"})
	if got := strings.Join(texts(evs, "stdout"), ""); got != "late" || last(evs).Type != "stdout" {
		t.Errorf("late: events %+v, want its output and no final event", evs)
	}
	resp, data := f.execd("GET", "/command/status/"+evs[0].Text, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"exit_code":3`) {
		t.Errorf("the status of the late command: %d %s", resp.StatusCode, data)
	}
}

// TestListSandboxesAndSnapshots proves the lists: sandboxes filtered by
// metadata, snapshots by source sandbox and name, in pages.
func TestListSandboxesAndSnapshots(t *testing.T) {
	t.Parallel()
	f := start(t, execd.Options{GracefulDelay: -1, SnapshotWork: 10 * time.Millisecond})
	for i := range 3 {
		f.lifecycle("POST", "/sandboxes", map[string]any{"image": map[string]string{"uri": "x"}, "metadata": map[string]string{"suite": "mine", "n": fmt.Sprint(i)}}, nil)
	}
	var list struct {
		Items      []sandboxReply
		Pagination struct {
			TotalItems  int
			HasNextPage bool
		}
	}
	f.lifecycle("GET", "/sandboxes?metadata="+url.QueryEscape("suite=mine")+"&pageSize=2", nil, &list)
	if len(list.Items) != 2 || list.Pagination.TotalItems != 3 || !list.Pagination.HasNextPage {
		t.Errorf("page 1 of suite=mine: %+v", list)
	}
	f.lifecycle("GET", "/sandboxes?metadata="+url.QueryEscape("suite=mine&n=1"), nil, &list)
	if len(list.Items) != 1 || list.Pagination.HasNextPage {
		t.Errorf("suite=mine&n=1: %+v", list)
	}
	a, b := f.snapshot("a"), f.snapshot("b")
	var snaps struct{ Items []snapshotReply }
	f.lifecycle("GET", "/snapshots?sandboxId="+f.id, nil, &snaps)
	if len(snaps.Items) != 2 || snaps.Items[0].ID != a || snaps.Items[1].ID != b {
		t.Errorf("the sandbox's snapshots: %+v, want %s and %s", snaps.Items, a, b)
	}
	f.lifecycle("GET", "/snapshots?name=b", nil, &snaps)
	if len(snaps.Items) != 1 || snaps.Items[0].ID != b {
		t.Errorf("the snapshots named b: %+v", snaps.Items)
	}
}
