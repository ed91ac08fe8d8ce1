package opencode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"strings"
	"syscall"
	"testing"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/harness"
)

// fakeEnv, in the environment of the test binary, makes it a stand-in for
// `opencode session list` and `opencode export`: "bun" writes a big export
// as OpenCode (a Bun program) does, with one write to a non-blocking stdout
// and no wait for the rest before it exits; "cut" always prints only the
// first half of the export. fakeLogEnv names a file each call is logged to.
const (
	fakeEnv    = "NGHARNESS_FAKE_OPENCODE"
	fakeLogEnv = "NGHARNESS_FAKE_OPENCODE_LOG"
)

// fakeTask is the task of the fake saved session.
const fakeTask = "print a lot"

// fakeExport is the saved session the fake OpenCode exports: the task, then
// a completed assistant turn whose tool printed size bytes, then the final
// text "finished".
func fakeExport(size int) []byte {
	out := strings.Repeat("0123456789abcdef", size/16)
	msgs := []any{
		map[string]any{"info": map[string]any{"id": "msg_1", "role": "user"}, "parts": []any{map[string]any{"type": "text", "text": fakeTask}}},
		map[string]any{
			"info":  map[string]any{"id": "msg_2", "role": "assistant", "parentID": "msg_1", "finish": "tool-calls", "time": map[string]any{"completed": 2}},
			"parts": []any{map[string]any{"type": "tool", "tool": "bash", "state": map[string]any{"status": "completed", "output": out}}},
		},
		map[string]any{
			"info":  map[string]any{"id": "msg_3", "role": "assistant", "parentID": "msg_1", "finish": "stop", "time": map[string]any{"completed": 3}},
			"parts": []any{map[string]any{"type": "text", "text": "finished"}},
		},
	}
	data, err := json.MarshalIndent(map[string]any{"info": map[string]any{"id": "ses_big", "directory": "/work"}, "messages": msgs}, "", "  ")
	if err != nil {
		panic(err)
	}
	return data
}

// fakeExportSize is the tool output of the fake session: the export is
// over 300 KB, well past a pipe's 64 KiB.
const fakeExportSize = 300 << 10

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeEnv); mode != "" {
		os.Exit(fakeOpenCode(mode, os.Args[1:]))
	}
	// The fake OpenCode is this binary run again, and the adapter waits
	// for it to exit.
	testkit.HelperExitsAtOnce()
	os.Exit(m.Run())
}

// fakeOpenCode is the test binary run as OpenCode (see fakeEnv).
func fakeOpenCode(mode string, args []string) int {
	if log := os.Getenv(fakeLogEnv); log != "" {
		f, err := os.OpenFile(log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintln(f, strings.Join(args, " "))
			f.Close()
		}
	}
	var out []byte
	switch {
	case len(args) == 4 && args[0] == "session" && args[1] == "list":
		out = []byte(`[{"id":"ses_big","updated":1}]`)
	case len(args) == 2 && args[0] == "export" && args[1] == "ses_big":
		fmt.Fprintln(os.Stderr, "Exporting session: ses_big")
		out = fakeExport(fakeExportSize)
		if mode == "cut" {
			out = out[:len(out)/2]
		}
	default:
		fmt.Fprintf(os.Stderr, "fake opencode: unexpected arguments %q\n", args)
		return 2
	}
	// As Bun does: stdout non-blocking, one write, exit. Into a pipe that
	// holds 64 KiB the write stops there; into a file it is whole.
	if err := syscall.SetNonblock(1, true); err != nil {
		return 1
	}
	if _, err := syscall.Write(1, out); err != nil {
		return 1
	}
	return 0
}

// fakeSandbox is a local sandbox (no namespace) holding a rollout's state
// folder with its task, and an adapter whose OpenCode is the test binary
// in mode (see fakeEnv), logging its calls to the returned file.
func fakeSandbox(t *testing.T, mode string) (*Adapter, harness.LentSandbox, json.RawMessage, string) {
	t.Helper()
	b, err := local.New(t.TempDir(), local.Options{Isolation: local.IsolationNone})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Create(context.Background(), "sb1")
	if err != nil {
		t.Fatal(err)
	}
	lent := harness.LentSandbox{Sandbox: sb}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	calls := path.Join(t.TempDir(), "calls.log")
	a, err := New(Options{OpenCode: self, CLIOptions: harness.CLIOptions{ModelURL: "http://127.0.0.1:9", Env: map[string]string{fakeEnv: mode, fakeLogEnv: calls, "GORACE": os.Getenv("GORACE")}}})
	if err != nil {
		t.Fatal(err)
	}
	// A state folder whose name a shell would act on: the commands the
	// adapter builds must pass it as data.
	st := State{Home: path.Join(sb.Root(), "state", "opencode", `r1 it's $(touch pwned) "x"; touch pwned2 #`)}
	if err := sb.Upload(context.Background(), path.Join(st.Home, taskFileName), []byte(fakeTask), 0o600); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(st)
	return a, lent, raw, calls
}

// TestExportPastAPipeIsReadWhole: OpenCode, like any Bun program, writes
// its stdout without blocking and exits before a pipe drains, so an export
// read straight from the exec channel's pipe stops at 64 KiB. With an
// OpenCode that does the same (one non-blocking write, then exit), a saved
// session whose export is over 300 KB is read whole by the resume decision
// (which continues it) and by the response collection (which hands it to
// verify with its final text). Before the fix both read the pipe: the
// decision failed with "unexpected end of JSON input" and the response had
// neither session nor final_text.
func TestExportPastAPipeIsReadWhole(t *testing.T) {
	a, sb, st, _ := fakeSandbox(t, "bun")
	ctx := context.Background()
	d, err := a.ResumeDecision(ctx, sb, st, "r1", 2)
	if err != nil || !d.Resume || !strings.Contains(d.Reason, "session ses_big starts with the task and holds 2 completed model responses") {
		t.Errorf("resume decision: %+v, error %v; want to resume ses_big, which holds 2 completed model responses", d, err)
	}
	raw, err := a.Response(ctx, sb, st, harness.HarnessResult{})
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Session     json.RawMessage `json:"session"`
		FinalText   string          `json:"final_text"`
		ExportError string          `json:"export_error"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		t.Fatal(err)
	}
	// The response holds the export compacted.
	var want bytes.Buffer
	if err := json.Compact(&want, fakeExport(fakeExportSize)); err != nil {
		t.Fatal(err)
	}
	if resp.Session == nil || !bytes.Equal(resp.Session, want.Bytes()) || resp.FinalText != "finished" || resp.ExportError != "" {
		t.Errorf("response: session of %d bytes (want the whole %d), final text %q (want \"finished\"), export error %q",
			len(resp.Session), want.Len(), resp.FinalText, resp.ExportError)
	}
	// The files OpenCode wrote its output to are gone.
	home, _ := parseState(st)
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"ls", "-a", home.Home}})
	if err != nil || strings.Contains(string(res.Stdout), exportFileName) || strings.Contains(string(res.Stdout), sessionsFileName) {
		t.Errorf("the state folder holds %q (%v), want no %s or %s left", res.Stdout, err, exportFileName, sessionsFileName)
	}
	for _, f := range []string{"pwned", "pwned2"} {
		if res, _ := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"test", "-e", f}}); res.ExitCode == 0 {
			t.Errorf("the state folder's name ran a command: %s exists in the workdir", f)
		}
	}
	t.Logf("export of %d bytes read whole through a non-blocking writer by the decision (%q) and the response", len(fakeExport(fakeExportSize)), d.Reason)
}

// TestUnreadableSessionStartsOver: a saved session whose export is never
// whole JSON (cut in half each time) is exported twice, then the resume
// decision starts over in a fresh folder with the reason (the rollout goes
// on: no error), and the response says export_error instead of failing.
// Before the fix the decision returned the error and the rollout failed.
func TestUnreadableSessionStartsOver(t *testing.T) {
	a, sb, st, calls := fakeSandbox(t, "cut")
	ctx := context.Background()
	d, err := a.ResumeDecision(ctx, sb, st, "r1", 2)
	if err != nil {
		t.Fatalf("resume decision failed: %v; want a fresh start", err)
	}
	if d.Resume || len(d.State) == 0 || string(d.State) == string(st) ||
		!strings.Contains(d.Reason, "the saved session could not be read") || !strings.Contains(d.Reason, "not one whole JSON document") ||
		!strings.Contains(d.Reason, "starting over with the task in a fresh data folder") {
		t.Errorf("resume decision: %+v; want a fresh state and a reason saying the saved session is not whole JSON", d)
	}
	log, _ := os.ReadFile(calls)
	if n := strings.Count(string(log), "export ses_big"); n != 2 {
		t.Errorf("the session was exported %d times, want 2 (one retry): %q", n, log)
	}
	raw, err := a.Response(ctx, sb, st, harness.HarnessResult{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"export_error":"opencode: the export of session ses_big is not one whole JSON document`) {
		t.Errorf("response %s, want an export_error saying the export is not whole", raw)
	}
	t.Logf("decision: %s", d.Reason)
}
