package fakeexecd_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/test/fakeexecd"
)

const key = "k"

// fx is a fake OpenSandbox with one sandbox, reached over raw HTTP.
type fx struct {
	t        *testing.T
	srv      *fakeexecd.Server
	id       string
	endpoint string
	headers  map[string]string
}

func start(t *testing.T, opt fakeexecd.Options) *fx {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the fake execd runs commands in mount namespaces of their own: it needs root")
	}
	opt.Base, opt.APIKey = t.TempDir(), key
	srv, err := fakeexecd.Start(opt)
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
	return f
}

func (f *fx) call(method, url, apiKey string, body io.Reader, header map[string]string) (*http.Response, []byte) {
	f.t.Helper()
	req, _ := http.NewRequest(method, url, body)
	if apiKey != "" {
		req.Header.Set(fakeexecd.APIKeyHeader, apiKey)
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
	f := start(t, fakeexecd.Options{GracefulDelay: -1})
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
	f := start(t, fakeexecd.Options{GracefulDelay: 700 * time.Millisecond, PingInterval: 200 * time.Millisecond})
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
	f := start(t, fakeexecd.Options{GracefulDelay: -1})
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
	f := start(t, fakeexecd.Options{})
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(f.srv.HostPath(f.id), "after")); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the command ended with its client")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBackgroundAndInterrupt proves a background command is unknown to
// the status endpoint right after its init (404), then known; that an
// interrupt of an unknown or finished id is 500 "no such session"; and
// that an interrupt blocks its grace (TERM, then KILL) before it answers,
// the command then reported as killed (exit_code -1).
func TestBackgroundAndInterrupt(t *testing.T) {
	t.Parallel()
	f := start(t, fakeexecd.Options{GracefulDelay: -1, RegisterDelay: 300 * time.Millisecond, InterruptGrace: 500 * time.Millisecond})
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, data = f.execd("GET", "/command/status/"+id, nil)
		if strings.Contains(string(data), `"running":false`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	f := start(t, fakeexecd.Options{GracefulDelay: -1, Env: []string{"PATH=" + os.Getenv("PATH"), "EXECD_OWN=from-execd"}})
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
	d := start(t, fakeexecd.Options{GracefulDelay: -1})
	if !strings.HasSuffix(d.endpoint, "/proxy/44772") || len(d.headers) != 0 {
		t.Errorf("docker endpoint %s %v", d.endpoint, d.headers)
	}
	if resp, _ := d.execd("GET", "/ping", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("ping through the proxy path: %d", resp.StatusCode)
	}
	if resp, _ := d.call("GET", strings.TrimSuffix(d.endpoint, "/proxy/44772")+"/ping", "", nil, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("ping at execd's own path: %d", resp.StatusCode)
	}
	k := start(t, fakeexecd.Options{GracefulDelay: -1, Runtime: fakeexecd.RuntimeKubernetes})
	if strings.Contains(k.endpoint, "/proxy/") || k.headers[fakeexecd.SecureAccessHeader] == "" {
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
	f := start(t, fakeexecd.Options{})
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
