package claude

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/harness"
)

// testOptions are Gym options with predictable ids.
func testOptions() gym.ResponseOptions {
	n := 0
	return gym.ResponseOptions{Model: "policy", NewHex: func() string { n++; return strings.Repeat("a", n) }}
}

// gymItems is a response's output items as JSON objects.
func gymItems(t *testing.T, r gym.Response) []map[string]any {
	t.Helper()
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Output []map[string]any `json:"output"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	return got.Output
}

// itemShape is items as type(call_id) list.
func itemShape(items []map[string]any) string {
	var out []string
	for _, it := range items {
		s, _ := it["type"].(string)
		if id, _ := it["call_id"].(string); id != "" {
			s += "(" + id + ")"
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

// TestBuildGymResponse: the finished session gives its thinking as
// reasoning, its text as a message, both parallel calls (arguments the
// input as JSON text) and both results (each its own, the first off the
// leaf's chain included), the final answer; the usage sums the two
// responses, input counting cache reads and writes, cache reads also as
// cached tokens. No session gives no output and a null usage.
func TestBuildGymResponse(t *testing.T) {
	r := BuildGymResponse(parseFixture(t, "finished.jsonl"), testOptions())
	items := gymItems(t, r)
	if got, want := itemShape(items), "reasoning,message,function_call(toolu_a1),function_call(toolu_a2),function_call_output(toolu_a1),function_call_output(toolu_a2),message"; got != want {
		t.Fatalf("items\n got %s\nwant %s", got, want)
	}
	if s, _ := json.Marshal(items[0]["summary"]); string(s) != `[{"text":"Two commands, in parallel.","type":"summary_text"}]` {
		t.Errorf("reasoning %v", items[0])
	}
	if items[2]["arguments"] != `{"command":"echo one","description":"Print one"}` || items[2]["name"] != "Bash" {
		t.Errorf("the first call %v", items[2])
	}
	if items[4]["output"] != "one" || items[5]["output"] != "two" {
		t.Errorf("outputs %v %v", items[4], items[5])
	}
	if u := r.Usage; u == nil || u.InputTokens != 3330 || u.InputTokensDetails.CachedTokens != 3000 || u.OutputTokens != 43 || u.TotalTokens != 3373 {
		t.Errorf("usage %+v", r.Usage)
	}
	// One reply over lines with results between them is counted once.
	if u := BuildGymResponse(parseFixture(t, "interleaved.jsonl"), testOptions()).Usage; u == nil || u.TotalTokens != 3373 {
		t.Errorf("interleaved usage %+v", u)
	}
	empty := BuildGymResponse(nil, testOptions())
	if empty.Usage != nil || len(empty.Output) != 0 || empty.Object != "response" {
		t.Errorf("no session: %+v", empty)
	}
}

// TestGymUnansweredCalls: calls the session holds no result for (killed
// mid-tool) get an empty output each, after the reply's calls and the
// results the session holds for its other calls, as an answered batch of
// parallel calls is laid out; a resumed session has its new result alone,
// the old off-chain one absent.
func TestGymUnansweredCalls(t *testing.T) {
	items := gymItems(t, BuildGymResponse(parseFixture(t, "midtool.jsonl"), testOptions()))
	if got, want := itemShape(items), "message,function_call(toolu_m1),function_call(toolu_m2),function_call_output(toolu_m1),function_call_output(toolu_m2)"; got != want {
		t.Errorf("mid-tool items\n got %s\nwant %s", got, want)
	}
	for _, it := range items {
		if it["type"] == "function_call_output" && it["output"] != "" {
			t.Errorf("an unanswered call's output %v", it)
		}
	}
	items = gymItems(t, BuildGymResponse(parseFixture(t, "partial.jsonl"), testOptions()))
	if got, want := itemShape(items), "function_call(toolu_p1),function_call(toolu_p2),function_call_output(toolu_p1),function_call_output(toolu_p2)"; got != want {
		t.Errorf("partial items\n got %s\nwant %s", got, want)
	}
	items = gymItems(t, BuildGymResponse(parseFixture(t, "resumed.jsonl"), testOptions()))
	if got, want := itemShape(items), "function_call(toolu_n1),function_call_output(toolu_n1),message"; got != want {
		t.Errorf("resumed items\n got %s\nwant %s", got, want)
	}
}

// TestResponseAndGymResult: Response stores the finished session's path,
// id, final text and its lines slimmed (the bookkeeping lines' type,
// uuid, parentUuid and sessionId alone, lines without a uuid left out),
// much smaller and read as the same session (the chain kept through the
// slimmed lines); GymResult builds the NeMoGymResponse from that stored
// shape, the claude_* fields beside it. No session is a session_error,
// and GymResult of it no output; a stored response not the adapter's is
// an error.
func TestResponseAndGymResult(t *testing.T) {
	a, _, lent := newAdapter(t, Options{CLIOptions: harness.CLIOptions{Model: "served"}})
	st, _ := a.NewState("r1", 1, lent)
	s := saveSession(t, st, "finished.jsonl", fixtureTask)
	res := harness.HarnessResult{ExitCode: 0, Stdout: []byte(strings.Repeat("o", 5000) + "END"), Stderr: []byte("err")}
	raw, err := a.Response(context.Background(), lent, st, res)
	if err != nil {
		t.Fatal(err)
	}
	var stored struct {
		ExitCode    int               `json:"exit_code"`
		SessionPath string            `json:"session_path"`
		SessionID   string            `json:"session_id"`
		Session     []json.RawMessage `json:"session"`
		FinalText   string            `json:"final_text"`
		Stdout      string            `json:"stdout_tail"`
	}
	if err := json.Unmarshal(raw, &stored); err != nil {
		t.Fatal(err)
	}
	whole := parseFixture(t, "finished.jsonl")
	files, _ := filepath.Glob(filepath.Join(s.configDir(), sessionGlob))
	if len(files) != 1 || stored.SessionPath != files[0] || stored.SessionID != whole.ID || stored.FinalText != "done" ||
		len(stored.Stdout) != 4000 || !strings.HasSuffix(stored.Stdout, "END") {
		t.Errorf("stored %+v", stored)
	}
	data, _ := harness.ArrayJSONLines(mustJSON(t, stored.Session))
	slim, err := ParseSession(data)
	if err != nil || shape(slim) != shape(whole) || len(raw) > len(readFixture(t, "finished.jsonl"))/5 {
		t.Errorf("the stored session (%d bytes of %d): %v, shape %s", len(raw), len(readFixture(t, "finished.jsonl")), err, shape(slim))
	}
	for _, l := range stored.Session {
		var line map[string]json.RawMessage
		_ = json.Unmarshal(l, &line)
		if _, ok := line["uuid"]; !ok {
			t.Errorf("a stored line without a uuid: %s", l)
		}
		if typ := string(line["type"]); typ != `"user"` && typ != `"assistant"` && len(line) != 4 {
			t.Errorf("a bookkeeping line kept whole: %.200s", l)
		}
	}

	body := json.RawMessage(`{"responses_create_params":{"input":"say hi then run the tool"}}`)
	resp, fields, err := a.GymResult(raw, body)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Model  string           `json:"model"`
		Output []map[string]any `json:"output"`
		Usage  *gym.Usage       `json:"usage"`
	}
	if err := json.Unmarshal(resp, &got); err != nil {
		t.Fatal(err)
	}
	if got.Model != "served" || itemShape(got.Output) != itemShape(gymItems(t, BuildGymResponse(whole, testOptions()))) || got.Usage == nil || got.Usage.TotalTokens != 3373 {
		t.Errorf("gym response %s", resp)
	}
	for k, v := range map[string]string{"claude_session_path": mustString(t, stored.SessionPath), "claude_session_found": "true", "claude_finished": "true", "claude_run_stderr": `"err"`} {
		if string(fields[k]) != v {
			t.Errorf("field %s = %s, want %s", k, fields[k], v)
		}
	}

	st2, _ := a.NewState("r2", 1, lent)
	raw, err = a.Response(context.Background(), lent, st2, harness.HarnessResult{ExitCode: 1})
	if err != nil || !strings.Contains(string(raw), `"session_error":"claude: no session file in `) {
		t.Errorf("no session: %s %v", raw, err)
	}
	resp, fields, err = a.GymResult(raw, body)
	if err != nil || !strings.Contains(string(resp), `"output":[]`) || string(fields["claude_session_found"]) != "false" || string(fields["claude_finished"]) != "false" {
		t.Errorf("no session's gym result %s %v %v", resp, fields, err)
	}
	if _, _, err := a.GymResult(json.RawMessage(`[1]`), body); err == nil || !strings.Contains(err.Error(), "claude: the stored response is not the adapter's") {
		t.Errorf("a foreign response: %v", err)
	}
	if _, _, err := a.GymResult(json.RawMessage(`{"session":[{"type":"user","message":{"role":"user","content":7}}]}`), body); err == nil || !strings.Contains(err.Error(), "claude: the stored session: line 1") {
		t.Errorf("a bad stored session: %v", err)
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mustString(t *testing.T, s string) string { return string(mustJSON(t, s)) }
