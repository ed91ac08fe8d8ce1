package pi

import (
	"bytes"
	"context"
	"encoding/json"
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

// itemShape is items as a type(call_id) list.
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

// TestBuildGymResponse: a whole run gives the bash call (its arguments as
// compact JSON text), its output and the final message, the task left out;
// the usage sums both responses. A reply with thinking, text and two calls,
// cut off mid-tool after a failed reply was retried, gives the reasoning,
// the message, both calls and an empty output for each (the failed reply
// left out, its usage not counted; cached and cache-written tokens counted
// as input, the cached ones also as cached). No session gives no output and
// a null usage.
func TestBuildGymResponse(t *testing.T) {
	r := BuildGymResponse(parse(t, sample(t, "done.jsonl", 0)), testOptions())
	items := gymItems(t, r)
	if got, want := itemShape(items), "function_call(call_fake1),function_call_output(call_fake1),message"; got != want {
		t.Fatalf("items\n got %s\nwant %s", got, want)
	}
	if items[0]["arguments"] != `{"command":"echo hello-from-tool","description":"Runs the scripted command"}` || items[0]["name"] != "bash" ||
		items[1]["output"] != "hello-from-tool\n" {
		t.Errorf("the call and its output: %v %v", items[0], items[1])
	}
	if u := r.Usage; u == nil || u.InputTokens != 1397+1470 || u.OutputTokens != 22+2 || u.TotalTokens != 1397+1470+22+2 {
		t.Errorf("usage %+v", r.Usage)
	}

	lines := bytes.SplitAfter(sample(t, "done.jsonl", 0), []byte{'\n'})
	failed := `{"type":"message","id":"0000dead","parentId":"63f5a617","timestamp":"x","message":{"role":"assistant","content":[{"type":"text","text":"partial"}],"stopReason":"aborted","usage":{"input":50,"output":5}}}` + "\n"
	reply := `{"type":"message","id":"0000beef","parentId":"0000dead","timestamp":"x","message":{"role":"assistant","content":[` +
		`{"type":"thinking","thinking":"Two commands."},{"type":"text","text":"Running "},{"type":"text","text":"both."},` +
		`{"type":"toolCall","id":"c1","name":"bash","arguments":{"command":"sleep 9"}},{"type":"toolCall","id":"c2","name":"read","arguments":{"path":"a"}}],` +
		`"stopReason":"toolUse","usage":{"input":100,"output":10,"cacheRead":1000,"cacheWrite":7}}}` + "\n"
	s := parse(t, []byte(string(bytes.Join(lines[:4], nil))+failed+reply))
	r = BuildGymResponse(s, testOptions())
	items = gymItems(t, r)
	if got, want := itemShape(items), "reasoning,message,function_call(c1),function_call(c2),function_call_output(c1),function_call_output(c2)"; got != want {
		t.Fatalf("mid-tool items\n got %s\nwant %s", got, want)
	}
	if c, _ := items[1]["content"].([]any); len(c) != 1 || c[0].(map[string]any)["text"] != "Running both." {
		t.Errorf("the message %v", items[1])
	}
	if items[4]["output"] != "" || items[5]["output"] != "" {
		t.Errorf("unanswered outputs %v %v", items[4], items[5])
	}
	if u := r.Usage; u == nil || u.InputTokens != 1107 || u.InputTokensDetails.CachedTokens != 1000 || u.OutputTokens != 10 || u.TotalTokens != 1117 {
		t.Errorf("mid-tool usage %+v", r.Usage)
	}
	if empty := BuildGymResponse(nil, testOptions()); empty.Usage != nil || len(empty.Output) != 0 || empty.Object != "response" {
		t.Errorf("no session: %+v", empty)
	}
}

// TestGymResult: GymResult builds the NeMoGymResponse from what Response
// stored, the model the options', and sets the pi_* fields beside it; no
// session gives no output and says so; a stored response that is not the
// adapter's is an error naming it.
func TestGymResult(t *testing.T) {
	a, sb, lent := newAdapter(t, Options{CLIOptions: harness.CLIOptions{Model: "served"}})
	raw, _ := a.NewState("r1", 1, lent)
	f := saveSession(t, stateOf(t, raw), sampleTask, inWorkdir(sample(t, "done.jsonl", 0), sb))
	stored, err := a.Response(context.Background(), lent, raw, harness.HarnessResult{ExitCode: 0, Stdout: []byte("out"), Stderr: []byte("err")})
	if err != nil {
		t.Fatal(err)
	}
	body := json.RawMessage(`{"responses_create_params":{"input":"say hi"}}`)
	resp, fields, err := a.GymResult(stored, body)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Model  string           `json:"model"`
		Output []map[string]any `json:"output"`
	}
	if err := json.Unmarshal(resp, &got); err != nil {
		t.Fatal(err)
	}
	if got.Model != "served" || itemShape(got.Output) != "function_call(call_fake1),function_call_output(call_fake1),message" {
		t.Errorf("gym response %s", resp)
	}
	path, _ := json.Marshal(f)
	for k, v := range map[string]string{"pi_session_path": string(path), "pi_session_found": "true", "pi_finished": "true", "pi_run_stdout": `"out"`, "pi_run_stderr": `"err"`} {
		if string(fields[k]) != v {
			t.Errorf("field %s = %s, want %s", k, fields[k], v)
		}
	}
	raw2, _ := a.NewState("r2", 1, lent)
	stored, _ = a.Response(context.Background(), lent, raw2, harness.HarnessResult{ExitCode: 1})
	resp, fields, err = a.GymResult(stored, body)
	if err != nil || !strings.Contains(string(resp), `"output":[]`) || string(fields["pi_session_found"]) != "false" || string(fields["pi_finished"]) != "false" {
		t.Errorf("no session's gym result %s %v %v", resp, fields, err)
	}
	if _, _, err := a.GymResult(json.RawMessage(`[1]`), body); err == nil || !strings.Contains(err.Error(), "pi: the stored response is not the adapter's") {
		t.Errorf("a foreign response: %v", err)
	}
}
