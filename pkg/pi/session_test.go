package pi

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The testdata sessions were written by Pi 0.73.1 through the launcher
// against internal/fake/model (task "say hi\nthen run the tool\n", one bash
// call, then "done"): done.jsonl is the whole run; error.jsonl a run whose
// one model call failed (no server: "Connection error."). A crash mid-tool
// leaves the first five lines of done.jsonl (the file ends with the
// call), one while the answer to the tool's result was awaited the first
// six (it ends with the result).

const sampleTask = "say hi\nthen run the tool\n"

// sample reads a testdata session, its first n lines (all when n is 0).
func sample(t *testing.T, name string, n int) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if n > 0 {
		lines := bytes.SplitAfter(data, []byte{'\n'})
		data = bytes.Join(lines[:n], nil)
	}
	return data
}

func parse(t *testing.T, data []byte) *Session {
	t.Helper()
	s, err := ParseSession(data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestParseSession: a whole run reads as its header (id, cwd), its leaf
// (the last entry) and the chain's four messages: the task, the bash call
// (toolUse, its usage), the result, the final answer; the settings entries
// are no messages, and nothing else is on the chain.
func TestParseSession(t *testing.T) {
	s := parse(t, sample(t, "done.jsonl", 0))
	if s.ID != "01a2348c-5230-7643-a3b8-34b5692d825b" || s.Cwd != "/tmp/pitry/work" || s.Leaf != "3830f516" || !s.Complete || len(s.Other) != 0 {
		t.Errorf("session %+v", s)
	}
	var roles []string
	for _, m := range s.Messages {
		roles = append(roles, m.Role)
	}
	if !slices.Equal(roles, []string{"user", "assistant", "toolResult", "assistant"}) {
		t.Fatalf("roles %q", roles)
	}
	call := s.Messages[1]
	if tc := call.ToolCalls(); len(tc) != 1 || tc[0].ID != "call_fake1" || tc[0].Name != "bash" || call.StopReason != "toolUse" ||
		call.Usage.Input != 1397 || call.Usage.Output != 22 || call.Entry != "b35feccd" || call.Parent != "63f5a617" {
		t.Errorf("the call %+v", call)
	}
	if r := s.Messages[2]; r.ToolCallID != "call_fake1" || r.Text() != "hello-from-tool\n" || r.IsError {
		t.Errorf("the result %+v", r)
	}
	if u := s.UserTurns(); len(u) != 1 || u[0] != sampleTask || len(s.Responses()) != 2 || s.FinalText() != "done" {
		t.Errorf("user turns %q, %d responses, final %q", u, len(s.Responses()), s.FinalText())
	}
	if ok, why := s.Continuable(sampleTask); !ok {
		t.Errorf("not continuable: %s", why)
	}
	if ok, why := s.Continuable("another task"); ok || !strings.Contains(why, "does not start with the task") {
		t.Errorf("continuable with another task: %v %s", ok, why)
	}
}

// TestParseSessionChain: the history is the chain from the file's last
// entry by parentId, not the file's order: an entry on another branch is
// left out. A last line cut short is left out and marks the session
// incomplete; a parent the file does not hold, a line before the header
// and a broken line inside are errors.
func TestParseSessionChain(t *testing.T) {
	lines := strings.SplitAfter(string(sample(t, "done.jsonl", 0)), "\n")
	// A branch: a second answer attached to the tool result, then the
	// chain goes on from the first answer.
	branch := strings.Replace(lines[6], `"id":"3830f516"`, `"id":"0000beef"`, 1)
	branch = strings.Replace(branch, `"text":"done"`, `"text":"other branch"`, 1)
	next := `{"type":"message","id":"0000cafe","parentId":"3830f516","timestamp":"x","message":{"role":"user","content":"again"}}` + "\n"
	s := parse(t, []byte(strings.Join(lines[:7], "")+branch+next))
	if s.Leaf != "0000cafe" || len(s.Messages) != 5 || s.Messages[3].Text() != "done" || s.Messages[4].Text() != "again" {
		t.Errorf("leaf %s, messages %+v", s.Leaf, s.Messages)
	}
	cut := parse(t, []byte(strings.Join(lines[:6], "")+lines[6][:40]))
	if cut.Complete || cut.Leaf != "2e6768f2" {
		t.Errorf("a cut last line: complete %v, leaf %s", cut.Complete, cut.Leaf)
	}
	for name, data := range map[string]string{
		"a missing parent":       lines[0] + lines[4],
		"before the header":      lines[1] + lines[0],
		"a broken line inside":   lines[0] + lines[1][:30] + "\n" + lines[2],
		"no header":              lines[1],
		"an entry without an id": lines[0] + `{"type":"message","message":{"role":"user","content":"x"}}` + "\n",
	} {
		if _, err := ParseSession([]byte(data)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// TestContinuation: what is due at each ending. Mid-tool (the file ends
// with the call): an error result for the call. After the tool (the file
// ends with its result): nothing added, the result goes as saved. A
// continued session cut mid-tool again: the new call gets the error
// result (the one saved for the first call is history). A
// reply with two calls, one answered: the other gets the error result. The
// run ended: nothing is sent. A failed reply after the result is dropped
// and the result goes again. A cut last line, a compaction on the chain,
// or failed replies after an unanswered call are not continued.
func TestContinuation(t *testing.T) {
	lines := strings.SplitAfter(string(sample(t, "done.jsonl", 0)), "\n")
	failed := `{"type":"message","id":"0000dead","parentId":"2e6768f2","timestamp":"x","message":{"role":"assistant","content":[],"stopReason":"error","errorMessage":"Connection error."}}` + "\n"
	// What a continue mid-tool saved, then the model's call made again.
	noResult := `{"type":"message","id":"0000e440","parentId":"b35feccd","timestamp":"x","message":{"role":"toolResult","toolCallId":"call_fake1","toolName":"bash","content":[{"type":"text","text":"No result provided"}],"isError":true}}` + "\n"
	again := `{"type":"message","id":"0000a9a1","parentId":"0000e440","timestamp":"x","message":{"role":"assistant","content":[{"type":"toolCall","id":"call_fake2","name":"bash","arguments":{"command":"touch done.txt"}}],"stopReason":"toolUse"}}` + "\n"
	twoCalls := strings.Replace(lines[4], `"content":[{"type":"toolCall",`, `"content":[{"type":"toolCall","id":"call_2","name":"bash","arguments":{"command":"true"}},{"type":"toolCall",`, 1)
	for _, c := range []struct {
		name string
		data string
		want Continuation
		what string
	}{
		{"mid-tool", strings.Join(lines[:5], ""), Continuation{At: "b35feccd", Answer: []Call{{"call_fake1", "bash"}}}, `the interrupted tool call with Pi's own error result "No result provided"`},
		{"after the tool", strings.Join(lines[:6], ""), Continuation{At: "2e6768f2"}, "the saved tool results whose answer never came"},
		{"one of two answered", strings.Join(lines[:4], "") + twoCalls + lines[5], Continuation{At: "2e6768f2", Answer: []Call{{"call_2", "bash"}}},
			`the saved tool result and, for the 1 interrupted call, Pi's own error result "No result provided"`},
		{"ended", strings.Join(lines, ""), Continuation{At: "3830f516", Ended: true}, "nothing: the session ended with the model's answer"},
		{"a failed reply", strings.Join(lines[:6], "") + failed, Continuation{At: "0000dead", Drop: 1}, "the saved tool results whose answer never came (the 1 failed reply after it left out, as Pi's own retry does)"},
		{"a prompt", string(sample(t, "error.jsonl", 4)), Continuation{At: "d469ffce"}, "the saved user message whose answer never came"},
		{"continued, then cut mid-tool again", strings.Join(lines[:5], "") + noResult + again, Continuation{At: "0000a9a1", Answer: []Call{{"call_fake2", "bash"}}},
			`the interrupted tool call with Pi's own error result "No result provided"`},
	} {
		got, err := parse(t, []byte(c.data)).Continuation()
		if err != nil || got.At != c.want.At || !slices.Equal(got.Answer, c.want.Answer) || got.Drop != c.want.Drop || got.Ended != c.want.Ended || got.What != c.what {
			t.Errorf("%s: %+v (%v), want %+v %q", c.name, got, err, c.want, c.what)
		}
	}
	compaction := `{"type":"compaction","id":"0000c0c0","parentId":"2e6768f2","timestamp":"x","summary":"s","firstKeptEntryId":"63f5a617","tokensBefore":9}` + "\n"
	for name, data := range map[string]string{
		"a cut last line":            strings.Join(lines[:5], "") + lines[5][:50],
		"a compaction":               strings.Join(lines[:6], "") + compaction,
		"failed after a cut tool":    strings.Join(lines[:5], "") + strings.Replace(failed, `"parentId":"2e6768f2"`, `"parentId":"b35feccd"`, 1),
		"only a failed reply":        string(sample(t, "error.jsonl", 0))[:0] + strings.Join(lines[:1], "") + strings.Replace(failed, `"parentId":"2e6768f2"`, `"parentId":null`, 1),
		"a result without its reply": lines[0] + strings.Replace(lines[5], `"parentId":"b35feccd"`, `"parentId":null`, 1),
	} {
		if c, err := parse(t, []byte(data)).Continuation(); err == nil {
			t.Errorf("%s: continued %+v", name, c)
		}
	}
}

// TestFailedReplyIsNoResponse: a run whose only model call failed holds
// no completed response, so it is not continued (the rule every adapter
// applies), and its failed reply is no final text.
func TestFailedReplyIsNoResponse(t *testing.T) {
	s := parse(t, sample(t, "error.jsonl", 0))
	if ok, why := s.Continuable(sampleTask); ok || !strings.Contains(why, "no completed model response") || s.FinalText() != "" {
		t.Errorf("continuable %v (%s), final %q", ok, why, s.FinalText())
	}
}
