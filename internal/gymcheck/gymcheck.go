// Package gymcheck checks a NeMoGymResponse as a Gym trainer reads it,
// and an adapter's /run reply that carries one. It imports nothing of the
// module, so the tests of any package (the fake adapter's own among them)
// may use it; internal/harnesstest forwards to it.
package gymcheck

import (
	"encoding/json"
	"testing"
)

// Shaper is an adapter that shapes its response as the /run reply of
// `ngdriver serve` carries it: a NeMoGymResponse and fields of its own.
type Shaper interface {
	GymResult(response, body json.RawMessage) (json.RawMessage, map[string]json.RawMessage, error)
}

// Reply shapes a stored response as the adapter's /run reply carries it
// (a's GymResult of response and the run body) and checks the
// NeMoGymResponse (Response). It returns the reply's own fields.
func Reply(t testing.TB, a Shaper, response, body json.RawMessage, tool, final string) map[string]json.RawMessage {
	t.Helper()
	resp, fields, err := a.GymResult(response, body)
	if err != nil {
		t.Fatalf("the Gym response of the run: %v", err)
	}
	Response(t, resp, tool, final)
	return fields
}

// Response checks a NeMoGymResponse as a Gym trainer reads it: the
// fields of Gym's model there (id, created_at, model, object "response",
// output, tools, tool_choice, parallel_tool_calls, usage), the last
// assistant text final, the usage counted, and, when tool is set, calls
// of tool each with its output.
func Response(t testing.TB, resp json.RawMessage, tool, final string) {
	t.Helper()
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(resp, &fields); err != nil {
		t.Fatalf("the Gym response is not a JSON object: %v\n%s", err, resp)
	}
	for _, k := range []string{"id", "created_at", "model", "object", "output", "tools", "tool_choice", "parallel_tool_calls", "usage"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("the Gym response has no %q: %s", k, resp)
		}
	}
	var gr struct {
		ID        string          `json:"id"`
		CreatedAt int64           `json:"created_at"`
		Object    string          `json:"object"`
		Model     string          `json:"model"`
		Tools     []any           `json:"tools"`
		Parallel  *bool           `json:"parallel_tool_calls"`
		Choice    json.RawMessage `json:"tool_choice"`
		Output    []struct {
			Type    string `json:"type"`
			Name    string `json:"name"`
			Role    string `json:"role"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage *struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(resp, &gr); err != nil {
		t.Fatalf("the Gym response is not a NeMoGymResponse: %v\n%s", err, resp)
	}
	if gr.ID == "" || gr.CreatedAt <= 0 || gr.Tools == nil || gr.Parallel == nil || len(gr.Choice) == 0 || string(gr.Choice) == "null" {
		t.Errorf("the Gym response: id %q created_at %d tools %v parallel_tool_calls %v tool_choice %s; want an id, a time, a tool list, a flag and a choice",
			gr.ID, gr.CreatedAt, gr.Tools, gr.Parallel, gr.Choice)
	}
	last, calls, outputs := "", 0, 0
	for _, it := range gr.Output {
		switch {
		case it.Type == "message" && it.Role == "assistant" && len(it.Content) > 0:
			last = it.Content[len(it.Content)-1].Text
		case it.Type == "function_call" && it.Name == tool:
			calls++
		case it.Type == "function_call_output":
			outputs++
		}
	}
	if tool != "" && (calls == 0 || calls != outputs) {
		t.Errorf("the Gym response holds %d %s calls and %d outputs, want one output a call", calls, tool, outputs)
	}
	if gr.Object != "response" || gr.Model == "" || last != final || gr.Usage == nil || gr.Usage.TotalTokens == 0 {
		t.Errorf("the Gym response: object %q model %q last assistant text %q usage %+v; want response, a model, %q, counted", gr.Object, gr.Model, last, gr.Usage, final)
	}
}
