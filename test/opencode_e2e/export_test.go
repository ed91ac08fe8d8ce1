package opencodee2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"testing"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/harness"
)

// savedState is the sandbox and the adapter's state of the one OpenCode
// state folder in it, as the driver would hand them to a later relaunch's
// resume decision and response.
func (w *world) savedState(sandboxID string) (harness.LentSandbox, json.RawMessage) {
	w.T.Helper()
	sb, err := w.Local.Open(sandboxID)
	if err != nil {
		w.T.Fatal(err)
	}
	homes, _ := filepath.Glob(filepath.Join(w.Local.HostPath(sandboxID), local.RootFolder, "state", "opencode", "*"))
	if len(homes) != 1 {
		w.T.Fatalf("OpenCode state folders in %s: %v, want one", sandboxID, homes)
	}
	state, _ := json.Marshal(map[string]string{"home": path.Join(sb.Root(), "state", "opencode", filepath.Base(homes[0]))})
	return harness.LentSandbox{Sandbox: sb}, state
}

// bashCall is a reply calling OpenCode's bash tool with command, and with
// a timeout in milliseconds unless timeoutMS is 0.
func bashCall(command string, timeoutMS int) fakemodel.Reply {
	args := map[string]any{"command": command, "description": "Runs the scripted command"}
	if timeoutMS > 0 {
		args["timeout"] = timeoutMS
	}
	data, err := json.Marshal(args)
	if err != nil {
		panic(err)
	}
	return fakemodel.Reply{ToolCall: &fakemodel.ToolCall{Name: "bash", Arguments: string(data)}}
}

// toolResults counts the tool results in a request's history.
func toolResults(r fakemodel.Request) int {
	n := 0
	for _, m := range r.Messages {
		if m.Role == "tool" {
			n++
		}
	}
	return n
}

// Tool calls of the large-export test: bigCalls calls each printing
// bigOutput bytes (OpenCode keeps about 50 KB of each twice in the session,
// as the tool's output and in its metadata), then one sleeping.
const (
	bigCalls  = 3
	bigOutput = 60000
	// bigExport is the size the session's export must pass.
	bigExport = 200000
	// bigRereads is how many more times the resume decision and the
	// response collection read the finished session's export.
	bigRereads = 3
)

// bigScript is the fake model of the large-export test: bigCalls tool
// calls printing bigOutput bytes each, then one sleeping two minutes
// before it writes done.txt; after an interrupted tool result, one writing
// done.txt; then the final text.
func bigScript(r fakemodel.Request) fakemodel.Reply {
	last := r.LastMessage()
	switch n := toolResults(r); {
	case !r.HasTools:
		return fakemodel.Reply{Text: titleText}
	case last.Role == "tool" && strings.Contains(last.Content, "interrupted"):
		return bashCall("touch done.txt", 0)
	case n < bigCalls:
		return bashCall(fmt.Sprintf("yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c %d", bigOutput), 0)
	case n == bigCalls:
		return bashCall("sleep 120; touch done.txt", 0)
	default:
		return fakemodel.Reply{Text: finalText}
	}
}

// TestLargeSessionExportReadWhole: a session whose export is over 200 KB
// (three tool calls printing 60 KB each, then one sleeping) is
// checkpointed mid-sleep, the driver crashes, and the fork is relaunched:
// the resume decision reads the saved session whole and continues it
// (resumed=true, through ngresume), and the response collection hands
// verify the whole export with its final text. The finished session is
// then read again bigRereads times by each. `opencode export` into a pipe
// loses what it wrote past 64 KiB in most runs (OpenCode exits before the
// pipe drains: 195 KB came through whole in 2 to 3 runs of 10), so before
// the fix the decision failed ("unexpected end of JSON input", the run
// returned an error), or the response lacked session and final_text; the
// rereads make a lucky pass of the old code all but impossible.
func TestLargeSessionExportReadWhole(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testLargeSessionExportReadWhole)
}

func testLargeSessionExportReadWhole(t *testing.T, ver openCode) {
	w := newWorld(t, ver, "bigexport", fakemodel.Options{Script: bigScript})
	c := w.crashAfterSnapshot(nil, w.toolWaits, w.toolStillRuns)
	r := w.relaunch(c, nil, nil)
	l2 := r.Launches[1]
	if !l2.Resumed || !strings.Contains(l2.Reason, "starts with the task and holds") {
		t.Errorf("launch 2: resumed %v, reason %q; want the saved session continued", l2.Resumed, l2.Reason)
	}
	if len(r.Response.Session) < bigExport {
		t.Fatalf("the response's session export is %d bytes, want a session over %d", len(r.Response.Session), bigExport)
	}
	after := parseSession(t, r.Response.Session)
	if after.Info.ID != c.saved.Info.ID || len(after.users()) != 1 {
		t.Errorf("the response holds session %s with user messages %q; want the saved session %s with the task alone", after.Info.ID, after.users(), c.saved.Info.ID)
	}

	// Read the finished session again, as a later relaunch and response
	// would: whole every time.
	lent, state := w.savedState(c.Fork)
	a := w.adapter(nil)
	for i := 1; i <= bigRereads; i++ {
		d, err := a.ResumeDecision(context.Background(), lent, state, w.Rollout, 3)
		if err != nil || !d.Resume {
			t.Errorf("reread %d: resume decision %+v, error %v; want the saved session continued", i, d, err)
		}
		raw, err := a.Response(context.Background(), lent, state, harness.HarnessResult{})
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
		if !bytes.Equal(resp.Session, r.Response.Session) || resp.FinalText != finalText || resp.ExportError != "" {
			t.Errorf("reread %d: response session of %d bytes (want the same %d), final text %q, export error %q",
				i, len(resp.Session), len(r.Response.Session), resp.FinalText, resp.ExportError)
		}
	}
	t.Logf("session export of %d bytes read whole by the relaunch's decision (%q), its response, and %d rereads of each",
		len(r.Response.Session), l2.Reason, bigRereads)
}
