package codex

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/gym"
)

// The testdata sessions are real Codex 0.171.0 session files, against the
// fake model (internal/fake/model's DefaultScript) with the task "run the
// tool": finished.jsonl a whole run (exec_command `echo hi`, then "done"),
// midtool.jsonl a run SIGKILLed while its tool call (`sleep 30; touch
// done.txt`) ran.
func readSessionFile(t *testing.T, name string) *Session {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseSession(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

// TestContinuable: the rule on real sessions: the finished and the
// mid-tool session start with the task and hold completed responses (2
// and 1); another task, no user turn, or no completed response is not
// continuable, each with its reason.
func TestContinuable(t *testing.T) {
	for _, c := range []struct {
		file      string
		responses int
	}{{"finished.jsonl", 2}, {"midtool.jsonl", 1}} {
		s := readSessionFile(t, c.file)
		if got := s.UserTurns(); len(got) != 1 || got[0] != "run the tool" {
			t.Errorf("%s: user turns %q, want the task alone", c.file, got)
		}
		ok, why := s.Continuable("run the tool")
		if !ok || len(s.Responses) != c.responses || !strings.Contains(why, s.ID) {
			t.Errorf("%s: continuable %v (%s) with %d responses, want true with %d", c.file, ok, why, len(s.Responses), c.responses)
		}
		if ok, why := s.Continuable("another task"); ok || !strings.Contains(why, "does not start with the task") {
			t.Errorf("%s: another task: %v %q", c.file, ok, why)
		}
	}
	s := readSessionFile(t, "midtool.jsonl")
	s.Responses = nil
	if ok, why := s.Continuable("run the tool"); ok || !strings.Contains(why, "no completed model response") {
		t.Errorf("no response: %v %q", ok, why)
	}
	s.Items = s.Items[:2] // the developer message and the environment context
	if ok, why := s.Continuable(""); ok || !strings.Contains(why, "no user message") {
		t.Errorf("no user turn: %v %q", ok, why)
	}
}

// TestParseSessionCutShort: a last line cut short (Codex killed while
// writing it) is left out; a bad line before the last is an error naming
// it; a file with neither meta nor items is an error.
func TestParseSessionCutShort(t *testing.T) {
	data, err := os.ReadFile("testdata/finished.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	whole := readSessionFile(t, "finished.jsonl")
	cut := append(append([]byte{}, data...), []byte(`{"timestamp":"x","type":"response_item","payload":{"ty`)...)
	s, err := ParseSession(cut)
	if err != nil || len(s.Items) != len(whole.Items) {
		t.Errorf("cut short: %v, %d items (want %d)", err, len(s.Items), len(whole.Items))
	}
	bad := append([]byte("{nope\n"), data...)
	if _, err := ParseSession(bad); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("a bad first line: %v", err)
	}
	if _, err := ParseSession([]byte("{}\n")); err == nil {
		t.Error("an empty session parsed")
	}
}

// TestBuildGymResponse: the finished session gives the call (arguments as
// sent), its output, the final message, and the usage summed over the two
// responses; no session gives no output and a null usage.
func TestBuildGymResponse(t *testing.T) {
	s := readSessionFile(t, "finished.jsonl")
	n := 0
	opt := gym.ResponseOptions{Model: "policy", NewHex: func() string { n++; return strings.Repeat("a", n) }}
	r := BuildGymResponse(s, opt)
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Output []map[string]any `json:"output"`
		Usage  map[string]any   `json:"usage"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, it := range got.Output {
		types = append(types, it["type"].(string))
	}
	if strings.Join(types, ",") != "function_call,function_call_output,message" {
		t.Fatalf("output item types %v", types)
	}
	if got.Output[0]["arguments"] != `{"cmd":"echo hi"}` || got.Output[0]["name"] != "exec_command" || got.Output[0]["call_id"] != got.Output[1]["call_id"] {
		t.Errorf("the call %v and its output %v", got.Output[0], got.Output[1])
	}
	if out, _ := got.Output[1]["output"].(string); !strings.Contains(out, "hi\n") {
		t.Errorf("the output %q", out)
	}
	var want int64
	for _, u := range s.Responses {
		want += u.Usage.TotalTokens
	}
	if r.Usage == nil || r.Usage.TotalTokens != want || want == 0 || r.Usage.InputTokens+r.Usage.OutputTokens != want {
		t.Errorf("usage %+v, want total %d", r.Usage, want)
	}
	empty := BuildGymResponse(nil, opt)
	if empty.Usage != nil || len(empty.Output) != 0 || empty.Object != "response" {
		t.Errorf("no session: %+v", empty)
	}
}

// TestGymUnansweredCall: a call the session holds no output for gets one:
// "" at the end of the session (it never returned), "aborted" when the
// session went on (what Codex sent the model after a resume).
func TestGymUnansweredCall(t *testing.T) {
	s := readSessionFile(t, "midtool.jsonl")
	outputOf := func(s *Session) []string {
		var out []string
		for _, it := range BuildGymResponse(s, gym.ResponseOptions{}).Output {
			if o, ok := it.(*gym.FunctionCallOutput); ok {
				out = append(out, o.Output)
			}
		}
		return out
	}
	if got := outputOf(s); len(got) != 1 || got[0] != "" {
		t.Errorf("a call at the end: outputs %q, want one empty", got)
	}
	s.Items = append(s.Items, Item{Type: "message", Role: "assistant", Content: []byte(`[{"type":"output_text","text":"ok"}]`)})
	if got := outputOf(s); len(got) != 1 || got[0] != "aborted" {
		t.Errorf("a call the session went on after: outputs %q, want [aborted]", got)
	}
}
