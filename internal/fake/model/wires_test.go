package model

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
)

// wireCase is one API with bodies of the same conversation and a reader
// of its streamed reply, for the tests every API must pass.
type wireCase struct {
	api  string
	path string
	// body is a streamed request of one user turn, offering a tool.
	body []byte
	// text reads a streamed reply whole and returns its text.
	text func(t *testing.T, res *http.Response) string
}

func wireCases() []wireCase {
	return []wireCase{
		{APIChat, "/v1/chat/completions", chatBody(true, false, true, user("x")),
			func(t *testing.T, res *http.Response) string {
				st := readStream(t, res, false)
				return st.text + toolNames(st.toolCalls)
			}},
		{APIResponses, "/v1/responses", responsesBody(true, true, inputText("user", "x")),
			func(t *testing.T, res *http.Response) string {
				st := readResponses(t, res)
				var calls []ToolCall
				for _, it := range st.items {
					if it.Type == "function_call" {
						calls = append(calls, ToolCall{Name: it.Name})
					}
				}
				return st.text + toolNames(calls)
			}},
		{APIMessages, "/v1/messages", messagesBody(true, true, nil, map[string]any{"role": "user", "content": "x"}),
			func(t *testing.T, res *http.Response) string {
				st := readMessages(t, res)
				var s string
				for _, b := range st.blocks {
					if b.Type == "text" {
						s += b.Text
					} else {
						s += "+" + b.Name
					}
				}
				return s
			}},
	}
}

func toolNames(calls []ToolCall) string {
	var s string
	for _, c := range calls {
		s += "+" + c.Name
	}
	return s
}

// TestEveryAPIHeld: on every API, a held streamed request is recorded and
// unanswered until Release, then answered with a whole stream; under the
// /ng-rollout/ prefix its rollout and attempt are parsed.
func TestEveryAPIHeld(t *testing.T) {
	for _, c := range wireCases() {
		t.Run(c.api, func(t *testing.T) {
			s := start(t, Options{Script: DefaultScript("echo x")})
			s.Hold(1)
			done := make(chan fetched, 1)
			go func() { done <- fetch(s.URL()+"/ng-rollout/r7-a3"+c.path, c.body) }()
			testkit.Eventually(t, "held", func() (bool, string) { return s.Held() == 1, "" })
			r := s.Requests()[0]
			if r.API != c.api || r.Rollout != "r7-a3" || r.Attempt != 3 || r.Path != "/ng-rollout/r7-a3"+c.path {
				t.Errorf("held request %s rollout %q attempt %d", r.summary(), r.Rollout, r.Attempt)
			}
			select {
			case f := <-done:
				t.Fatalf("answered while held: %v", f.err)
			case <-time.After(100 * time.Millisecond):
			}
			s.Release()
			f := <-done
			if f.err != nil {
				t.Fatal(f.err)
			}
			want := "+" + r.ShellCall("echo x").Name
			if got := c.text(t, f.res); got != want {
				t.Errorf("reply %q, want %q", got, want)
			}
		})
	}
}

// TestEveryAPIPaceClientGone: a client that goes away in the middle of a
// slow stream ends it: the server logs it and closes without waiting for
// the rest.
func TestEveryAPIPaceClientGone(t *testing.T) {
	for _, c := range wireCases() {
		t.Run(c.api, func(t *testing.T) {
			var logs logRecorder
			s := New(Options{Logf: logs.logf(t), Script: func(Request) Reply { return Reply{Text: strings.Repeat("x", 200), Pace: time.Hour} }})
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithCancel(context.Background())
			res, err := post(ctx, s.URL()+c.path, c.body)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 1)
			if _, err := io.ReadFull(res.Body, buf); err != nil {
				t.Fatalf("no first event: %v", err)
			}
			cancel()
			res.Body.Close()
			testkit.Eventually(t, "the stream cut short", func() (bool, string) { return logs.count("the client went away") == 1, "" })
			s.Close()
		})
	}
}

// TestEveryAPIBadBodies: on every API, a body that is not one of its
// requests gets a 400 whose error object (the API's shape) says in one line
// what is wrong, and nothing is recorded.
func TestEveryAPIBadBodies(t *testing.T) {
	cases := []struct {
		path, body, want string
	}{
		{"/v1/chat/completions", "not json", "not a chat-completions request"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":7}]}`, "messages[0].content"},
		{"/v1/responses", "", "not a Responses request"},
		{"/v1/responses", `{"model":"m"}`, "no input"},
		{"/v1/responses", `{"input":7}`, "input is neither a string nor an array"},
		{"/v1/responses", `{"input":[{"content":"x"}]}`, "input[0]: an item with neither type nor role"},
		{"/v1/responses", `{"input":[{"type":"message","content":"x"}]}`, "input[0]: a message with no role"},
		{"/v1/responses", `{"input":[{"role":"user","content":{"a":1}}]}`, "input[0].content"},
		{"/v1/responses", `{"input":[{"type":"function_call_output","output":"x"}]}`, "input[0]: a function_call_output with no call_id"},
		{"/v1/responses", `{"input":[{"type":"function_call","call_id":"c","arguments":{"cmd":"ls"}}]}`, "input[0]"},
		{"/v1/messages", "[1]", "not a Messages request"},
		{"/v1/messages", `{"model":"m","max_tokens":1}`, "no messages"},
		{"/v1/messages", `{"messages":[{"role":"tool","content":"x"}]}`, `messages[0].role is "tool"`},
		{"/v1/messages", `{"messages":[{"role":"user","content":5}]}`, "messages[0].content"},
		{"/v1/messages", `{"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, "messages[0].content: [0]: a tool_result with no tool_use_id"},
		{"/v1/messages", `{"system":{"a":1},"messages":[]}`, "system"},
	}
	s := start(t, Options{})
	for _, c := range cases {
		res, err := http.Post(s.URL()+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var openai struct {
			Error struct{ Message, Type string } `json:"error"`
		}
		var anthropic struct {
			Type  string                         `json:"type"`
			Error struct{ Type, Message string } `json:"error"`
		}
		var msg string
		if c.path == "/v1/messages" {
			if err := json.Unmarshal(data, &anthropic); err != nil || anthropic.Type != "error" || anthropic.Error.Type != "invalid_request_error" {
				t.Errorf("%s %q: not an Anthropic error: %s", c.path, c.body, data)
			}
			msg = anthropic.Error.Message
		} else {
			if err := json.Unmarshal(data, &openai); err != nil || openai.Error.Type != "invalid_request_error" {
				t.Errorf("%s %q: not an OpenAI error: %s", c.path, c.body, data)
			}
			msg = openai.Error.Message
		}
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
			t.Errorf("%s %q: status %d, message %q, want 400 and %q", c.path, c.body, res.StatusCode, msg, c.want)
		}
	}
	if n := len(s.Requests()); n != 0 {
		t.Errorf("%d bad requests recorded", n)
	}
}

// TestSameHistoryEveryAPI: one conversation (a system prompt, a user turn,
// a tool call and its result) sent in each API's own shape normalises to
// the same Messages and HistoryKey, and one script (DefaultScript) drives
// every harness: a title for no tools, its own shell call for a user turn,
// the final answer after a tool result.
func TestSameHistoryEveryAPI(t *testing.T) {
	s := start(t, Options{Script: DefaultScript("echo x")})
	const args = `{"command":"echo x"}`
	bodies := map[string][]byte{
		"/v1/chat/completions": chatBody(false, false, true,
			msg{"role": "system", "content": "sys"}, user("hi"),
			msg{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "c1", "type": "function", "function": map[string]any{"name": "sh", "arguments": args}}}},
			msg{"role": "tool", "tool_call_id": "c1", "content": "x\n"}),
		"/v1/responses": mustMarshal(map[string]any{"instructions": "sys", "tools": []any{map[string]any{"type": "function", "name": "sh"}}, "input": []any{
			inputText("user", "hi"),
			map[string]any{"type": "function_call", "call_id": "c1", "name": "sh", "arguments": args},
			map[string]any{"type": "function_call_output", "call_id": "c1", "output": "x\n"},
		}}),
		"/v1/messages": messagesBody(false, true, "sys",
			map[string]any{"role": "user", "content": "hi"},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "c1", "name": "sh", "input": map[string]any{"command": "echo x"}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "c1", "content": "x\n"}}}),
	}
	keys := map[string]string{}
	for path, body := range bodies {
		res, data := mustPost(t, s.URL()+path, body)
		if res.StatusCode != http.StatusOK || !strings.Contains(string(data), `"`+DefaultFinal+`"`) {
			t.Errorf("%s: status %d: %s", path, res.StatusCode, data)
		}
		reqs := s.Requests()
		keys[path] = reqs[len(reqs)-1].HistoryKey()
	}
	want := mustJSON(t, []Message{
		textMessage("system", []string{"sys"}), textMessage("user", []string{"hi"}),
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Name: "sh", Arguments: args}}},
		{Role: "tool", Content: "x\n", Parts: []string{"x\n"}, ToolCallID: "c1"},
	})
	for path, k := range keys {
		if k != want {
			t.Errorf("%s: history\n %s\nwant %s", path, k, want)
		}
	}

	for _, c := range []struct{ api, name string }{{APIChat, "bash"}, {APIResponses, "exec_command"}, {APIMessages, "Bash"}} {
		script := DefaultScript("ls")
		if r := script(Request{API: c.api}); r.Text != DefaultTitle || r.ToolCall != nil {
			t.Errorf("%s, no tools: %+v", c.api, r)
		}
		r := script(Request{API: c.api, HasTools: true, Messages: []Message{{Role: "user"}}})
		if r.ToolCall == nil || r.ToolCall.Name != c.name || !strings.Contains(r.ToolCall.Arguments, `"ls"`) {
			t.Errorf("%s, a user turn: %+v", c.api, r)
		}
		if r := script(Request{API: c.api, HasTools: true, Messages: []Message{{Role: "tool"}}}); r.Text != DefaultFinal || r.ToolCall != nil {
			t.Errorf("%s, a tool result: %+v", c.api, r)
		}
	}
}

func mustMarshal(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}
