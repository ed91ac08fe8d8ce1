package model

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// responsesBody is a Responses request body with the given input items,
// offering the exec_command tool if tools.
func responsesBody(stream, tools bool, input ...any) []byte {
	body := map[string]any{"model": "fake-model", "input": input, "stream": stream, "store": false}
	if tools {
		body["tools"] = []any{map[string]any{"type": "function", "name": "exec_command", "parameters": map[string]any{"type": "object"}}}
		body["tool_choice"] = "auto"
	}
	data, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return data
}

// inputText is a Responses message item of role with one input_text part.
func inputText(role, text string) map[string]any {
	return map[string]any{"type": "message", "role": role, "content": []any{map[string]any{"type": "input_text", "text": text}}}
}

// rEvent is a Responses stream event as a client decodes it.
type rEvent struct {
	Type         string          `json:"type"`
	Seq          *int            `json:"sequence_number"`
	Response     *rResponse      `json:"response"`
	OutputIndex  *int            `json:"output_index"`
	ContentIndex *int            `json:"content_index"`
	ItemID       string          `json:"item_id"`
	Item         *rItem          `json:"item"`
	Delta        string          `json:"delta"`
	Text         string          `json:"text"`
	Arguments    string          `json:"arguments"`
	Part         json.RawMessage `json:"part"`
}

type rResponse struct {
	ID     string  `json:"id"`
	Object string  `json:"object"`
	Status string  `json:"status"`
	Model  string  `json:"model"`
	Output []rItem `json:"output"`
	Usage  *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

type rItem struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Status  string `json:"status"`
	Role    string `json:"role"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// rStream is a Responses stream, checked for shape and put together.
type rStream struct {
	events   []rEvent
	types    []string
	text     string // the output_text deltas
	args     string // the function_call_arguments deltas
	items    []rItem
	response rResponse // the completed one
}

// readResponses reads a streamed Responses reply and checks its framing
// and order: every event named by its type with sequence numbers 0, 1,
// ...; response.created and response.in_progress first (in progress, the
// same response id), response.completed last (completed, that id, usage,
// its output the items done); every item added before its deltas and done
// after them; the deltas put together equal to the done text and
// arguments.
func readResponses(t *testing.T, res *http.Response) rStream {
	t.Helper()
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, data)
	}
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" || res.ContentLength != -1 {
		t.Errorf("Content-Type %q, ContentLength %d: want a stream", ct, res.ContentLength)
	}
	var st rStream
	open := map[int]*rItem{} // added, not done yet, by output index
	var text, args strings.Builder
	for i, raw := range readEvents(t, res.Body) {
		var ev rEvent
		if err := json.Unmarshal([]byte(raw.data), &ev); err != nil {
			t.Fatalf("event %d %q: %v", i, raw.data, err)
		}
		if ev.Type != raw.name || ev.Seq == nil || *ev.Seq != i {
			t.Errorf("event %d: named %q, type %q, sequence_number %v", i, raw.name, ev.Type, ev.Seq)
		}
		st.events = append(st.events, ev)
		st.types = append(st.types, ev.Type)
		switch ev.Type {
		case "response.created", "response.in_progress":
			if i > 1 || ev.Response == nil || ev.Response.Status != "in_progress" || ev.Response.Object != "response" ||
				!strings.HasPrefix(ev.Response.ID, "resp_") || ev.Response.Model != "fake-model" || len(ev.Response.Output) != 0 {
				t.Errorf("event %d: %s", i, raw.data)
			}
			if i == 1 && ev.Response.ID != st.events[0].Response.ID {
				t.Errorf("in_progress names response %q, created %q", ev.Response.ID, st.events[0].Response.ID)
			}
		case "response.output_item.added":
			if ev.OutputIndex == nil || *ev.OutputIndex != len(st.items) || open[*ev.OutputIndex] != nil || ev.Item == nil || ev.Item.Status != "in_progress" || ev.Item.ID == "" {
				t.Fatalf("event %d: %s", i, raw.data)
			}
			open[*ev.OutputIndex] = ev.Item
		case "response.content_part.added", "response.content_part.done", "response.output_text.delta", "response.output_text.done",
			"response.function_call_arguments.delta", "response.function_call_arguments.done":
			if ev.OutputIndex == nil || open[*ev.OutputIndex] == nil || open[*ev.OutputIndex].ID != ev.ItemID {
				t.Fatalf("event %d is not inside an added item: %s", i, raw.data)
			}
			item := open[*ev.OutputIndex]
			isText := strings.Contains(ev.Type, "_text.") || strings.Contains(ev.Type, "content_part")
			if isText != (item.Type == "message") || (isText && (ev.ContentIndex == nil || *ev.ContentIndex != 0)) {
				t.Errorf("event %d in a %s item: %s", i, item.Type, raw.data)
			}
			switch ev.Type {
			case "response.output_text.delta":
				text.WriteString(ev.Delta)
			case "response.output_text.done":
				if ev.Text != text.String() {
					t.Errorf("output_text.done %q, deltas %q", ev.Text, text.String())
				}
			case "response.function_call_arguments.delta":
				args.WriteString(ev.Delta)
			case "response.function_call_arguments.done":
				if ev.Arguments != args.String() {
					t.Errorf("function_call_arguments.done %q, deltas %q", ev.Arguments, args.String())
				}
			}
		case "response.output_item.done":
			if ev.OutputIndex == nil || open[*ev.OutputIndex] == nil || ev.Item == nil || ev.Item.ID != open[*ev.OutputIndex].ID ||
				ev.Item.Type != open[*ev.OutputIndex].Type || ev.Item.Status != "completed" {
				t.Fatalf("event %d: %s", i, raw.data)
			}
			delete(open, *ev.OutputIndex)
			st.items = append(st.items, *ev.Item)
		case "response.completed":
			if ev.Response == nil {
				t.Fatalf("event %d: %s", i, raw.data)
			}
			st.response = *ev.Response
		default:
			t.Errorf("event %d: unexpected type %q", i, ev.Type)
		}
	}
	n := len(st.types)
	if n < 4 || st.types[0] != "response.created" || st.types[1] != "response.in_progress" || st.types[n-1] != "response.completed" {
		t.Fatalf("event types %q", st.types)
	}
	if len(open) != 0 {
		t.Errorf("items added and never done: %v", open)
	}
	r := st.response
	if r.ID != st.events[0].Response.ID || r.Status != "completed" || r.Usage == nil || r.Usage.InputTokens <= 0 ||
		r.Usage.OutputTokens <= 0 || r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Errorf("completed response %+v", r)
	}
	if mustJSON(t, r.Output) != mustJSON(t, st.items) {
		t.Errorf("completed output %+v, items done %+v", r.Output, st.items)
	}
	st.text, st.args = text.String(), args.String()
	return st
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func postResponses(t *testing.T, url string, body []byte) rStream {
	t.Helper()
	f := fetch(url, body)
	if f.err != nil {
		t.Fatal(f.err)
	}
	return readResponses(t, f.res)
}

// TestResponsesToolCallRoundTrip: on /v1/responses, DefaultScript answers a
// user turn with one streamed exec_command function_call (added with empty
// arguments, the arguments in pieces, done with call_id and {"cmd": ...});
// the client sends the call and its function_call_output back, which parse
// into an assistant tool call and a tool message, and get the final text as
// a streamed message item.
func TestResponsesToolCallRoundTrip(t *testing.T) {
	const cmd = `echo "hi there" ünïcode`
	s := start(t, Options{Script: DefaultScript(cmd)})
	url := s.URL() + "/v1/responses"
	history := []any{inputText("developer", "be brief"), inputText("user", "run it")}

	call := postResponses(t, url, responsesBody(true, true, history...))
	want := []string{"response.created", "response.in_progress", "response.output_item.added"}
	if got := call.types[:3]; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("first events %q", got)
	}
	if call.text != "" || len(call.items) != 1 {
		t.Fatalf("text %q items %+v", call.text, call.items)
	}
	fc := call.items[0]
	if fc.Type != "function_call" || fc.Name != "exec_command" || !strings.HasPrefix(fc.CallID, "call_") || fc.Arguments != call.args {
		t.Errorf("function call %+v (argument deltas %q)", fc, call.args)
	}
	var args map[string]string
	if err := json.Unmarshal([]byte(fc.Arguments), &args); err != nil || args["cmd"] != cmd || len(args) != 1 {
		t.Errorf("arguments %q (%v)", fc.Arguments, err)
	}
	if deltas := strings.Count(strings.Join(call.types, " "), "function_call_arguments.delta"); deltas < 2 {
		t.Errorf("%d argument deltas, want the arguments in pieces", deltas)
	}

	history = append(history,
		map[string]any{"type": "function_call", "id": fc.ID, "status": "completed", "name": fc.Name, "call_id": fc.CallID, "arguments": fc.Arguments},
		map[string]any{"type": "function_call_output", "call_id": fc.CallID, "output": "hi there ünïcode\n"},
	)
	final := postResponses(t, url, responsesBody(true, true, history...))
	if final.text != DefaultFinal || len(final.items) != 1 || final.items[0].Type != "message" || final.items[0].Role != "assistant" ||
		len(final.items[0].Content) != 1 || final.items[0].Content[0].Type != "output_text" || final.items[0].Content[0].Text != DefaultFinal {
		t.Errorf("final text %q items %+v", final.text, final.items)
	}
	if final.response.ID == call.response.ID {
		t.Errorf("both responses have id %q", final.response.ID)
	}

	reqs := s.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[1]
	if r.API != APIResponses || r.Path != "/v1/responses" || !r.Stream || !r.HasTools || len(r.Tools) != 1 || r.Tools[0] != "exec_command" {
		t.Errorf("request %s tools %q", r.summary(), r.Tools)
	}
	wantMsgs := []Message{
		{Role: "developer", Content: "be brief", Parts: []string{"be brief"}},
		{Role: "user", Content: "run it", Parts: []string{"run it"}},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: fc.CallID, Name: "exec_command", Arguments: fc.Arguments}}},
		{Role: "tool", Content: "hi there ünïcode\n", Parts: []string{"hi there ünïcode\n"}, ToolCallID: fc.CallID},
	}
	if mustJSON(t, r.Messages) != mustJSON(t, wantMsgs) {
		t.Errorf("messages %s\nwant     %s", mustJSON(t, r.Messages), mustJSON(t, wantMsgs))
	}
	if reqs[0].HistoryKey() == r.HistoryKey() {
		t.Error("two histories share a key")
	}
}

// TestResponsesTextAndToolCall: a reply with text and a tool call streams
// the message item (output index 0) before the function call (1).
func TestResponsesTextAndToolCall(t *testing.T) {
	s := start(t, Options{Script: func(Request) Reply {
		return Reply{Text: "let me look", ToolCall: &ToolCall{ID: "call_mine", Name: "exec_command", Arguments: `{"cmd":"ls"}`}}
	}})
	st := postResponses(t, s.URL()+"/v1/responses", responsesBody(true, true, inputText("user", "x")))
	if st.text != "let me look" || len(st.items) != 2 || st.items[0].Type != "message" || st.items[1].Type != "function_call" ||
		st.items[1].CallID != "call_mine" || st.items[1].Arguments != `{"cmd":"ls"}` {
		t.Errorf("text %q items %+v", st.text, st.items)
	}
}

// TestResponsesNonStream: without stream, the reply is one completed
// response object, with the same items a stream ends with.
func TestResponsesNonStream(t *testing.T) {
	s := start(t, Options{Script: DefaultScript("echo hello")})
	res, data := mustPost(t, s.URL()+"/v1/responses", responsesBody(false, true, inputText("user", "run")))
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q: %s", res.StatusCode, res.Header.Get("Content-Type"), data)
	}
	var r rResponse
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if r.Object != "response" || r.Status != "completed" || !strings.HasPrefix(r.ID, "resp_") || len(r.Output) != 1 ||
		r.Output[0].Type != "function_call" || r.Output[0].Arguments != `{"cmd":"echo hello"}` || r.Usage == nil {
		t.Errorf("response %s", data)
	}
	if s.Requests()[0].Stream {
		t.Error("recorded as streamed")
	}
}

// TestResponsesParsing: instructions become a system message first; a
// string input is one user message; every text part of a message is kept
// byte for byte (quotes, $(...), backticks, newlines); output_text parts of
// an assistant message count, images do not; function_call_output may be
// text parts; reasoning items are left out; custom tool calls and their
// outputs are tool calls and tool messages; an unknown item is kept under
// its type.
func TestResponsesParsing(t *testing.T) {
	s := start(t, Options{})
	url := s.URL() + "/v1/responses"
	hostile := "it's \"quoted\" $(rm -rf /) `id`\nline two\n\ttab ✓"
	send := func(body map[string]any) Request {
		t.Helper()
		data, _ := json.Marshal(body)
		res, out := mustPost(t, url, data)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", res.StatusCode, out)
		}
		reqs := s.Requests()
		return reqs[len(reqs)-1]
	}

	r := send(map[string]any{"model": "m", "instructions": "sys", "input": hostile})
	if want := []Message{textMessage("system", []string{"sys"}), textMessage("user", []string{hostile})}; mustJSON(t, r.Messages) != mustJSON(t, want) {
		t.Errorf("string input: %s", mustJSON(t, r.Messages))
	}
	if r.HasTools || r.Model != "m" {
		t.Errorf("request %s", r.summary())
	}

	unknown := map[string]any{"type": "local_shell_call", "call_id": "c9", "action": map[string]any{"command": []string{"ls"}}}
	r = send(map[string]any{"input": []any{
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_text", "text": "<environment_context/>"},
			map[string]any{"type": "input_image", "image_url": "data:x"},
			map[string]any{"type": "input_text", "text": hostile},
		}},
		map[string]any{"type": "reasoning", "summary": []any{}},
		map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "ok"}}},
		map[string]any{"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": `{"cmd":"ls"}`},
		map[string]any{"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
		map[string]any{"type": "function_call_output", "call_id": "c1", "output": []any{map[string]any{"type": "input_text", "text": "a\n"}, map[string]any{"type": "input_text", "text": "b"}}},
		map[string]any{"type": "custom_tool_call_output", "call_id": "c2", "output": "patched"},
		unknown,
	}, "tools": []any{map[string]any{"type": "function", "name": "exec_command"}, map[string]any{"type": "web_search"}}})
	want := []Message{
		{Role: "user", Content: "<environment_context/>\n" + hostile, Parts: []string{"<environment_context/>", hostile}},
		{Role: "assistant", Content: "ok", Parts: []string{"ok"}, ToolCalls: []ToolCall{
			{ID: "c1", Name: "exec_command", Arguments: `{"cmd":"ls"}`}, {ID: "c2", Name: "apply_patch", Arguments: "*** Begin Patch"},
		}},
		{Role: "tool", Content: "a\n\nb", Parts: []string{"a\n", "b"}, ToolCallID: "c1"},
		{Role: "tool", Content: "patched", Parts: []string{"patched"}, ToolCallID: "c2"},
		{Role: "local_shell_call", Content: mustJSON(t, unknown)},
	}
	if mustJSON(t, r.Messages) != mustJSON(t, want) {
		t.Errorf("items:\n got %s\nwant %s", mustJSON(t, r.Messages), mustJSON(t, want))
	}
	if strings.Join(r.Tools, ",") != "exec_command,web_search" || !r.HasTools {
		t.Errorf("tools %q", r.Tools)
	}
}

// TestResponsesPace: a reply's Pace spaces its events: the first comes at
// once, and the rest of the stream of n events takes at least n-1 paces
// after it.
func TestResponsesPace(t *testing.T) {
	const pace = 30 * time.Millisecond
	s := start(t, Options{Script: func(Request) Reply { return Reply{Text: "slow", Pace: pace} }})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	res, err := post(ctx, s.URL()+"/v1/responses", responsesBody(true, false, inputText("user", "x")))
	if err != nil {
		t.Fatal(err)
	}
	tr := &timedReader{r: res.Body}
	res.Body = io.NopCloser(tr)
	st := readResponses(t, res)
	took := time.Since(tr.first)
	if min := time.Duration(len(st.events)-1) * pace; took < min || st.text != "slow" {
		t.Errorf("%d events in %v after the first (want at least %v), text %q", len(st.events), took, min, st.text)
	}
}

// timedReader notes when its first bytes came.
type timedReader struct {
	r     io.Reader
	first time.Time
}

func (tr *timedReader) Read(p []byte) (int, error) {
	n, err := tr.r.Read(p)
	if n > 0 && tr.first.IsZero() {
		tr.first = time.Now()
	}
	return n, err
}
