package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/hosttest"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/harness"
)

// TestReadNewestFile: on a real /bin/sh, in a folder whose name holds
// spaces, quotes, $(...) and a glob character: the newest file matching
// the glob is read (its path and content byte for byte, a content without
// a final newline and with blank lines kept), a folder or a file matching
// elsewhere is passed over, none matching reads as "" and nil, and the
// folder's name is never shell text (the $(...) touches nothing).
func TestReadNewestFile(t *testing.T) {
	sb := hosttest.New(t)
	lent := harness.LentSandbox{Sandbox: sb}
	dir := filepath.Join(sb.Dir, `a b 'q' "dq" $(touch pwned) *`)
	ctx := context.Background()
	if file, data, err := harness.ReadNewestFile(ctx, lent, dir, "projects/*/*.jsonl"); err != nil || file != "" || data != nil {
		t.Fatalf("no folder: %q %q %v", file, data, err)
	}
	write := func(rel, content string, age time.Duration) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("projects/old/x.jsonl", "old\n", time.Hour)
	newest := write("projects/new dir/y.jsonl", "{\"a\":1}\n\n{\"b\":2}", time.Minute)
	write("projects/newer.jsonl", "not below a project folder", 0)
	write("other/z.jsonl", "not matching", 0)
	if err := os.MkdirAll(filepath.Join(dir, "projects", "p", "d.jsonl"), 0o755); err != nil {
		t.Fatal(err)
	}
	file, data, err := harness.ReadNewestFile(ctx, lent, dir, "projects/*/*.jsonl")
	if err != nil || file != newest || string(data) != "{\"a\":1}\n\n{\"b\":2}" {
		t.Errorf("newest: %q %q %v; want %q", file, data, err, newest)
	}
	if _, err := os.Stat(filepath.Join(sb.Workdir(), "pwned")); err == nil {
		t.Error("the folder's name ran as shell text")
	}
	if file, data, err := harness.ReadNewestFile(ctx, lent, dir, "sessions/*.jsonl"); err != nil || file != "" || data != nil {
		t.Errorf("none matching: %q %q %v", file, data, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := harness.ReadNewestFile(cancelled, lent, dir, "projects/*/*.jsonl"); err == nil || !strings.Contains(err.Error(), "projects/*/*.jsonl") {
		t.Errorf("a cancelled read: %v, want an error naming what was read", err)
	}
}

// TestReadSandboxFile: a file is read byte for byte (a name with spaces
// and quotes, a leading dash); a missing one reads as ok false and no
// error.
func TestReadSandboxFile(t *testing.T) {
	sb := hosttest.New(t)
	lent := harness.LentSandbox{Sandbox: sb}
	p := filepath.Join(sb.Dir, `-n 'q' "dq"`, "-task.txt")
	want := "-e line\n$(id) `id`\n\x01"
	if err := sb.Upload(context.Background(), p, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	data, ok, err := harness.ReadSandboxFile(context.Background(), lent, p)
	if err != nil || !ok || string(data) != want {
		t.Errorf("read %q %v %v, want %q", data, ok, err, want)
	}
	data, ok, err = harness.ReadSandboxFile(context.Background(), lent, p+".missing")
	if err != nil || ok || len(data) != 0 {
		t.Errorf("a missing file: %q %v %v", data, ok, err)
	}
}

// TestReadTail: a launch's stdout (LaunchStdout) is read whole when it is
// within the bound; past it, its last bytes from the first whole line
// (the line the bound cut is left out); a missing file reads as ok false
// and no error.
func TestReadTail(t *testing.T) {
	sb := hosttest.New(t)
	lent := harness.LentSandbox{Sandbox: sb}
	dir := filepath.Join(sb.Root(), "launches", "-L 1")
	p := harness.LaunchStdout(dir)
	if p != filepath.Join(dir, "stdout") {
		t.Fatalf("LaunchStdout %q", p)
	}
	if err := sb.Upload(context.Background(), p, []byte("first line\nsecond\nthird\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		max  int
		want string
	}{
		{100, "first line\nsecond\nthird\n"},
		{24, "first line\nsecond\nthird\n"},
		{20, "second\nthird\n"},
		{13, "second\nthird\n"},
		{12, "third\n"},
		{5, ""},
	} {
		data, ok, err := harness.ReadTail(context.Background(), lent, p, c.max)
		if err != nil || !ok || string(data) != c.want {
			t.Errorf("max %d: %q %v %v, want %q", c.max, data, ok, err, c.want)
		}
	}
	if data, ok, err := harness.ReadTail(context.Background(), lent, p+".missing", 10); err != nil || ok || len(data) != 0 {
		t.Errorf("a missing file: %q %v %v", data, ok, err)
	}
}

// TestJSONLinesArray: JSON lines become one JSON array (blank lines and a
// last line cut short left out), and ArrayJSONLines gives the lines back
// one a line; null or nothing is no data, anything but an array an
// error.
func TestJSONLinesArray(t *testing.T) {
	in := "{\"a\":1}\n\n  [1,2]  \n\"s\"\n{\"cut\":"
	arr := harness.JSONLinesArray([]byte(in))
	if string(arr) != `[{"a":1},[1,2],"s"]` || !json.Valid(arr) {
		t.Errorf("array %s", arr)
	}
	if got := harness.JSONLinesArray(nil); string(got) != "[]" {
		t.Errorf("no lines: %s", got)
	}
	back, err := harness.ArrayJSONLines(arr)
	if err != nil || string(back) != "{\"a\":1}\n[1,2]\n\"s\"\n" {
		t.Errorf("back %q %v", back, err)
	}
	for _, raw := range []string{"", "null"} {
		if data, err := harness.ArrayJSONLines(json.RawMessage(raw)); data != nil || err != nil {
			t.Errorf("%q: %q %v", raw, data, err)
		}
	}
	if _, err := harness.ArrayJSONLines(json.RawMessage(`{"a":1}`)); err == nil || !strings.Contains(err.Error(), "not a list of lines") {
		t.Errorf("an object: %v", err)
	}
}

// TestArgumentsJSON: a tool call's saved arguments become compact JSON
// text; none, blank input or text that is not JSON is "{}".
func TestArgumentsJSON(t *testing.T) {
	for in, want := range map[string]string{
		"{ \"command\": \"ls -l\",\n \"n\": [1, 2] }": `{"command":"ls -l","n":[1,2]}`,
		"":           "{}",
		"  ":         "{}",
		"{not json":  "{}",
		`"a string"`: `"a string"`,
	} {
		if got := harness.ArgumentsJSON(json.RawMessage(in)); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// TestAdapterOptionChecks: the checks adapters share name the adapter and
// the config key: model_url set and http(s) with a host; env names
// variable names; timeout a Go duration ("" none).
func TestAdapterOptionChecks(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"http://127.0.0.1:9", ""}, {"https://h/base/", ""},
		{"", "x: the model server (x.model_url) is required"},
		{"127.0.0.1:9", `x: model_url "127.0.0.1:9" is not an http(s) URL`},
		{"ftp://h", `x: model_url "ftp://h" is not an http(s) URL`},
		{"http://", `x: model_url "http://" is not an http(s) URL`},
		{"http://h/%zz", `x: model_url "http://h/%zz" is not an http(s) URL`},
	} {
		if err := harness.CheckModelURL("x", c.url); (err == nil) != (c.want == "") || err != nil && err.Error() != c.want {
			t.Errorf("CheckModelURL(%q): %v, want %q", c.url, err, c.want)
		}
	}
	if err := harness.CheckEnvNames("x", map[string]string{"A_B": "=", "c": ""}); err != nil {
		t.Errorf("good names: %v", err)
	}
	for _, k := range []string{"", "A=B", "A\x00"} {
		if err := harness.CheckEnvNames("x", map[string]string{k: "1"}); err == nil || err.Error() != fmt.Sprintf("x: env name %q is not a variable name", k) {
			t.Errorf("env name %q: %v", k, err)
		}
	}
	if d, err := harness.ParseTimeout("x", ""); d != 0 || err != nil {
		t.Errorf("no timeout: %v %v", d, err)
	}
	if d, err := harness.ParseTimeout("x", "1m30s"); d != 90*time.Second || err != nil {
		t.Errorf("1m30s: %v %v", d, err)
	}
	if _, err := harness.ParseTimeout("x", "soon"); err == nil || err.Error() != `x: timeout "soon": time: invalid duration "soon"` {
		t.Errorf("a bad timeout: %v", err)
	}
}

// TestStateHomeAndSegment: a state names an absolute folder, else the
// error names the adapter and the state; the rollout segment escapes the
// id as one path segment.
func TestStateHomeAndSegment(t *testing.T) {
	if home, err := harness.StateHome("x", json.RawMessage(`{"home":"/s/a b"}`)); home != "/s/a b" || err != nil {
		t.Errorf("a good state: %q %v", home, err)
	}
	for _, raw := range []string{`{"home":"rel"}`, `{}`, `nope`, `{"home":7}`} {
		if _, err := harness.StateHome("x", json.RawMessage(raw)); err == nil || err.Error() != "x: the state "+raw+" names no absolute folder" {
			t.Errorf("state %s: %v", raw, err)
		}
	}
	if got := harness.RolloutSegment("r/1?#% x", 2); got != "r%2F1%3F%23%25%20x-a2" {
		t.Errorf("segment %q", got)
	}
}

// TestReadStoredRun: a stored response is read back with its session's
// lines; none stored is nil lines; a response or session of another
// shape is an error naming the adapter. JSONFields splits a value into
// its JSON fields.
func TestReadStoredRun(t *testing.T) {
	raw := json.RawMessage(`{"exit_code":3,"session":[{"a":1},{"b":2}],"session_path":"/p","stdout_tail":"o","stderr_tail":"e","other":1}`)
	r, data, err := harness.ReadStoredRun("x", raw)
	if err != nil || r.ExitCode != 3 || r.SessionPath != "/p" || r.Stdout != "o" || r.Stderr != "e" || string(data) != "{\"a\":1}\n{\"b\":2}\n" {
		t.Errorf("read %+v %q %v", r, data, err)
	}
	if _, data, err := harness.ReadStoredRun("x", json.RawMessage(`{"exit_code":1}`)); err != nil || data != nil {
		t.Errorf("no session: %q %v", data, err)
	}
	if _, _, err := harness.ReadStoredRun("x", json.RawMessage(`[1]`)); err == nil || !strings.HasPrefix(err.Error(), "x: the stored response is not the adapter's: ") {
		t.Errorf("an array: %v", err)
	}
	if _, _, err := harness.ReadStoredRun("x", json.RawMessage(`{"session":{}}`)); err == nil || !strings.HasPrefix(err.Error(), "x: the stored session is not a list of lines") {
		t.Errorf("a session object: %v", err)
	}
	fields, err := harness.JSONFields(struct {
		A string `json:"x_a"`
		B bool   `json:"x_b"`
	}{"s", true})
	if err != nil || len(fields) != 2 || string(fields["x_a"]) != `"s"` || string(fields["x_b"]) != "true" {
		t.Errorf("fields %v %v", fields, err)
	}
	if _, err := harness.JSONFields(7); err == nil {
		t.Error("a number split into fields")
	}
}

// TestLinesGymResult: the stored session's lines reach parse, its result
// build (with the model and the body's request side), and the fields
// are split beside the response; none stored gives parse nothing and
// found false; a session parse refuses is an error naming the adapter.
func TestLinesGymResult(t *testing.T) {
	parse := func(data []byte) (*string, error) {
		if strings.Contains(string(data), "bad") {
			return nil, errors.New("line 1 is bad")
		}
		s := string(data)
		return &s, nil
	}
	build := func(s *string, opt gym.ResponseOptions) gym.Response {
		r := gym.NewResponse(&opt)
		if s != nil {
			r.Output = append(r.Output, &gym.InputMessage{Content: []gym.InputText{{Text: *s, Type: "input_text"}}, Role: "user", Type: "message"})
		}
		return r
	}
	fields := func(r harness.StoredRun, found bool) any {
		return map[string]any{"x_found": found, "x_exit": r.ExitCode}
	}
	body := json.RawMessage(`{"responses_create_params":{"input":"hi"}}`)
	resp, f, err := harness.LinesGymResult("x", json.RawMessage(`{"exit_code":2,"session":[{"a":1}]}`), body, "served", parse, build, fields)
	if err != nil || !strings.Contains(string(resp), `"text":"{\"a\":1}\n"`) || !strings.Contains(string(resp), `"model":"served"`) ||
		string(f["x_found"]) != "true" || string(f["x_exit"]) != "2" {
		t.Errorf("a session: %s %v %v", resp, f, err)
	}
	resp, f, err = harness.LinesGymResult("x", json.RawMessage(`{"exit_code":0}`), body, "served", parse, build, fields)
	if err != nil || !strings.Contains(string(resp), `"output":[]`) || string(f["x_found"]) != "false" {
		t.Errorf("no session: %s %v %v", resp, f, err)
	}
	if _, _, err := harness.LinesGymResult("x", json.RawMessage(`{"session":["bad"]}`), body, "served", parse, build, fields); err == nil || err.Error() != "x: the stored session: line 1 is bad" {
		t.Errorf("a bad session: %v", err)
	}
}

// TestReadSavedSession: no session file, one parse refuses (named by its
// name) and a good one with its task are told apart, the first two as
// the reason of a fresh start naming the folder; a missing task reads as
// none; a cancelled ctx is the one error.
func TestReadSavedSession(t *testing.T) {
	sb := hosttest.New(t)
	lent := harness.LentSandbox{Sandbox: sb}
	dir, task := filepath.Join(sb.Dir, "st ate"), filepath.Join(sb.Dir, "st ate", "task.txt")
	parse := func(data []byte) (string, error) {
		if strings.HasPrefix(string(data), "bad") {
			return "", errors.New("line 1 is bad")
		}
		return string(data), nil
	}
	ctx := context.Background()
	read := func() (string, string, string, error) {
		return harness.ReadSavedSession(ctx, lent, dir, "s/*.jsonl", task, "THE_DIR", parse)
	}
	if _, _, why, err := read(); err != nil || why != "the saved THE_DIR holds no session" {
		t.Errorf("no session: %q %v", why, err)
	}
	if err := sb.Upload(ctx, filepath.Join(dir, "s", "a.jsonl"), []byte("bad\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, why, err := read(); err != nil || why != "the saved session a.jsonl could not be read (line 1 is bad)" {
		t.Errorf("a bad session: %q %v", why, err)
	}
	if err := sb.Upload(ctx, filepath.Join(dir, "s", "a.jsonl"), []byte("good\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, tk, why, err := read(); err != nil || why != "" || s != "good\n" || tk != "" {
		t.Errorf("no task: %q %q %q %v", s, tk, why, err)
	}
	if err := sb.Upload(ctx, task, []byte("the task\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, tk, why, err := read(); err != nil || why != "" || s != "good\n" || tk != "the task\n" {
		t.Errorf("a session and its task: %q %q %q %v", s, tk, why, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, why, err := harness.ReadSavedSession(cancelled, lent, dir, "s/*.jsonl", task, "THE_DIR", parse); err == nil || why != "" {
		t.Errorf("cancelled: %q %v", why, err)
	}
}
