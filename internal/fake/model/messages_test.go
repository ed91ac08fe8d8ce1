package model

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// messagesBody is a Messages request body, offering the Bash tool if
// tools.
func messagesBody(stream, tools bool, system any, msgs ...any) []byte {
	body := map[string]any{"model": "claude-fake", "max_tokens": 1024, "messages": msgs, "stream": stream}
	if system != nil {
		body["system"] = system
	}
	if tools {
		body["tools"] = []any{map[string]any{"name": "Bash", "input_schema": map[string]any{"type": "object"}}}
	}
	data, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return data
}

// postMessages posts to /v1/messages?beta=true with x-api-key, as Claude
// Code does.
func postMessages(t *testing.T, s *Server, body []byte) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL()+"/v1/messages?beta=true", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	req = req.WithContext(ctx)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-api-key", "dummy")
	req.Header.Set("anthropic-version", "2023-06-01")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// mEvent is a Messages stream event as a client decodes it.
type mEvent struct {
	Type    string `json:"type"`
	Message *struct {
		ID         string          `json:"id"`
		Type       string          `json:"type"`
		Role       string          `json:"role"`
		Model      string          `json:"model"`
		Content    []any           `json:"content"`
		StopReason *string         `json:"stop_reason"`
		Usage      json.RawMessage `json:"usage"`
	} `json:"message"`
	Index        *int `json:"index"`
	ContentBlock *struct {
		Type  string          `json:"type"`
		Text  *string         `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content_block"`
	Delta *struct {
		Type        string  `json:"type"`
		Text        string  `json:"text"`
		PartialJSON string  `json:"partial_json"`
		StopReason  *string `json:"stop_reason"`
	} `json:"delta"`
	Usage *struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// mBlock is a content block put together from its events.
type mBlock struct {
	Type, ID, Name, Text, Input string
	deltas                      int
}

// mStream is a Messages stream, checked for shape and put together.
type mStream struct {
	types  []string
	id     string
	blocks []mBlock
	stop   string
}

// readMessages reads a streamed Messages reply and checks its framing and
// order: every event named by its type; message_start first (an assistant
// message with no content, no stop reason, input tokens), then blocks
// each opened by content_block_start at the next index, deltas of that
// index and type, content_block_stop; then message_delta with the stop
// reason and output tokens, and message_stop last.
func readMessages(t *testing.T, res *http.Response) mStream {
	t.Helper()
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, data)
	}
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" || res.ContentLength != -1 {
		t.Errorf("Content-Type %q, ContentLength %d: want a stream", ct, res.ContentLength)
	}
	var st mStream
	var cur *mBlock
	for i, raw := range readEvents(t, res.Body) {
		var ev mEvent
		if err := json.Unmarshal([]byte(raw.data), &ev); err != nil {
			t.Fatalf("event %d %q: %v", i, raw.data, err)
		}
		if ev.Type != raw.name {
			t.Errorf("event %d named %q has type %q", i, raw.name, ev.Type)
		}
		st.types = append(st.types, ev.Type)
		if (i == 0) != (ev.Type == "message_start") {
			t.Fatalf("event %d is %s", i, raw.data)
		}
		if st.stop != "" && ev.Type != "message_stop" {
			t.Errorf("event %d after message_delta: %s", i, raw.data)
		}
		switch ev.Type {
		case "message_start":
			m := ev.Message
			if m == nil || !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.Model != "claude-fake" ||
				len(m.Content) != 0 || m.StopReason != nil || !strings.Contains(string(m.Usage), `"input_tokens":`) {
				t.Errorf("message_start %s", raw.data)
			}
			if m != nil {
				st.id = m.ID
			}
		case "ping":
		case "content_block_start":
			if cur != nil || ev.Index == nil || *ev.Index != len(st.blocks) || ev.ContentBlock == nil {
				t.Fatalf("event %d: %s", i, raw.data)
			}
			cb := ev.ContentBlock
			switch cb.Type {
			case "text":
				if cb.Text == nil || *cb.Text != "" {
					t.Errorf("text block start %s", raw.data)
				}
			case "tool_use":
				if cb.ID == "" || cb.Name == "" || string(cb.Input) != "{}" {
					t.Errorf("tool_use block start %s", raw.data)
				}
			default:
				t.Errorf("block type %q", cb.Type)
			}
			cur = &mBlock{Type: cb.Type, ID: cb.ID, Name: cb.Name}
		case "content_block_delta":
			if cur == nil || ev.Index == nil || *ev.Index != len(st.blocks) || ev.Delta == nil {
				t.Fatalf("event %d outside its block: %s", i, raw.data)
			}
			switch {
			case cur.Type == "text" && ev.Delta.Type == "text_delta":
				cur.Text += ev.Delta.Text
			case cur.Type == "tool_use" && ev.Delta.Type == "input_json_delta":
				cur.Input += ev.Delta.PartialJSON
			default:
				t.Errorf("a %s delta in a %s block", ev.Delta.Type, cur.Type)
			}
			cur.deltas++
		case "content_block_stop":
			if cur == nil || ev.Index == nil || *ev.Index != len(st.blocks) {
				t.Fatalf("event %d: %s", i, raw.data)
			}
			st.blocks = append(st.blocks, *cur)
			cur = nil
		case "message_delta":
			if cur != nil || ev.Delta == nil || ev.Delta.StopReason == nil || ev.Usage == nil || ev.Usage.OutputTokens <= 0 {
				t.Fatalf("event %d: %s", i, raw.data)
			}
			st.stop = *ev.Delta.StopReason
		case "message_stop":
			if i != len(st.types)-1 || st.stop == "" {
				t.Errorf("event %d: message_stop", i)
			}
		default:
			t.Errorf("event %d: unexpected type %q", i, ev.Type)
		}
	}
	if n := len(st.types); n < 5 || st.types[n-1] != "message_stop" || st.types[n-2] != "message_delta" {
		t.Fatalf("event types %q", st.types)
	}
	return st
}

// TestMessagesToolCallRoundTrip: on /v1/messages?beta=true with x-api-key,
// DefaultScript answers a user turn with one streamed Bash tool_use block
// (input {} at the start, then input_json_delta pieces that make
// {"command", "description"}) and stop_reason tool_use; the client sends the
// tool_use and an is_error tool_result back, with a system prompt as text
// blocks and a role "system" message as Claude Code does, which parse into
// a system message, an assistant tool call and an error tool message, and
// get the final text with end_turn.
func TestMessagesToolCallRoundTrip(t *testing.T) {
	const cmd = `echo "hi there" ünïcode`
	s := start(t, Options{Script: DefaultScript(cmd)})
	system := []any{map[string]any{"type": "text", "text": "sys one"}, map[string]any{"type": "text", "text": "sys two", "cache_control": map[string]any{"type": "ephemeral"}}}
	userTurn := map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "<system-reminder>r</system-reminder>"},
		map[string]any{"type": "text", "text": "run it"},
	}}
	env := map[string]any{"role": "system", "content": "# Environment"}

	call := readMessages(t, postMessages(t, s, messagesBody(true, true, system, userTurn, env)))
	if call.stop != "tool_use" || len(call.blocks) != 1 {
		t.Fatalf("stop %q blocks %+v", call.stop, call.blocks)
	}
	b := call.blocks[0]
	var args map[string]string
	if err := json.Unmarshal([]byte(b.Input), &args); err != nil || b.Type != "tool_use" || b.Name != "Bash" ||
		!strings.HasPrefix(b.ID, "toolu_") || args["command"] != cmd || args["description"] == "" || len(args) != 2 {
		t.Errorf("tool_use block %+v (%v)", b, err)
	}
	if b.deltas < 2 {
		t.Errorf("%d input_json_delta pieces, want the input in pieces", b.deltas)
	}

	assistant := map[string]any{"role": "assistant", "content": []any{
		map[string]any{"type": "tool_use", "id": b.ID, "name": b.Name, "input": json.RawMessage(b.Input)},
	}}
	result := map[string]any{"role": "user", "content": []any{map[string]any{
		"type": "tool_result", "tool_use_id": b.ID, "is_error": true,
		"content": []any{map[string]any{"type": "text", "text": "Exit code 1\n"}, map[string]any{"type": "text", "text": "boom"}},
	}}}
	final := readMessages(t, postMessages(t, s, messagesBody(true, true, system, userTurn, env, assistant, result)))
	if final.stop != "end_turn" || len(final.blocks) != 1 || final.blocks[0].Type != "text" || final.blocks[0].Text != DefaultFinal {
		t.Errorf("final stop %q blocks %+v", final.stop, final.blocks)
	}
	if final.id == call.id {
		t.Errorf("both messages have id %q", call.id)
	}

	reqs := s.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[1]
	if r.API != APIMessages || r.Path != "/v1/messages" || r.Model != "claude-fake" || !r.Stream || strings.Join(r.Tools, ",") != "Bash" ||
		r.Header.Get("X-Api-Key") != "dummy" {
		t.Errorf("request %s tools %q header %v", r.summary(), r.Tools, r.Header)
	}
	want := []Message{
		{Role: "system", Content: "sys one\nsys two", Parts: []string{"sys one", "sys two"}},
		{Role: "user", Content: "<system-reminder>r</system-reminder>\nrun it", Parts: []string{"<system-reminder>r</system-reminder>", "run it"}},
		{Role: "system", Content: "# Environment", Parts: []string{"# Environment"}},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: b.ID, Name: "Bash", Arguments: b.Input}}},
		{Role: "tool", Content: "Exit code 1\n\nboom", Parts: []string{"Exit code 1\n", "boom"}, ToolCallID: b.ID, IsError: true},
	}
	if mustJSON(t, r.Messages) != mustJSON(t, want) {
		t.Errorf("messages:\n got %s\nwant %s", mustJSON(t, r.Messages), mustJSON(t, want))
	}
}

// TestMessagesTextAndToolCall: a reply with text and a tool call streams
// the text block (index 0) before the tool_use block (1).
func TestMessagesTextAndToolCall(t *testing.T) {
	s := start(t, Options{Script: func(Request) Reply {
		return Reply{Text: "let me look ✓", ToolCall: &ToolCall{ID: "toolu_mine", Name: "Read", Arguments: `{"file_path":"a"}`}}
	}})
	st := readMessages(t, postMessages(t, s, messagesBody(true, true, "sys", map[string]any{"role": "user", "content": "x"})))
	if st.stop != "tool_use" || len(st.blocks) != 2 || st.blocks[0].Type != "text" || st.blocks[0].Text != "let me look ✓" ||
		st.blocks[1].ID != "toolu_mine" || st.blocks[1].Name != "Read" || st.blocks[1].Input != `{"file_path":"a"}` {
		t.Errorf("stop %q blocks %+v", st.stop, st.blocks)
	}
}

// TestMessagesNonStream: without stream, the reply is one message object
// with its blocks, stop reason and usage.
func TestMessagesNonStream(t *testing.T) {
	s := start(t, Options{Script: DefaultScript("echo hello")})
	res := postMessages(t, s, messagesBody(false, true, nil, map[string]any{"role": "user", "content": "run"}))
	data, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var m struct {
		ID         string `json:"id"`
		Type       string `json:"type"`
		Role       string `json:"role"`
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type  string          `json:"type"`
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		} `json:"content"`
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &m); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s (%v)", res.StatusCode, data, err)
	}
	if m.Type != "message" || m.Role != "assistant" || m.StopReason != "tool_use" || len(m.Content) != 1 || m.Content[0].Type != "tool_use" ||
		m.Content[0].Name != "Bash" || !strings.Contains(string(m.Content[0].Input), `"command":"echo hello"`) || m.Usage.InputTokens <= 0 || m.Usage.OutputTokens <= 0 {
		t.Errorf("message %s", data)
	}
}

// TestMessagesParsing: a user message's text after its tool results
// follows them as a user message; images and thinking blocks are left out;
// a message left with nothing is kept, empty, so an added empty turn still
// shows; a string system prompt is one part.
func TestMessagesParsing(t *testing.T) {
	s := start(t, Options{})
	body := messagesBody(false, false, "sys",
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "image", "source": map[string]any{"type": "base64"}}}},
		map[string]any{"role": "assistant", "content": []any{
			map[string]any{"type": "thinking", "thinking": "hmm", "signature": "x"},
			map[string]any{"type": "text", "text": "a"},
			map[string]any{"type": "tool_use", "id": "t1", "name": "Bash", "input": map[string]any{"command": "ls"}},
			map[string]any{"type": "tool_use", "id": "t2", "name": "Read", "input": map[string]any{}},
		}},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "tool_result", "tool_use_id": "t1", "content": "out"},
			map[string]any{"type": "tool_result", "tool_use_id": "t2"},
			map[string]any{"type": "text", "text": "Continue from where you left off."},
		}},
		map[string]any{"role": "user", "content": ""},
	)
	res := postMessages(t, s, body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	want := []Message{
		{Role: "system", Content: "sys", Parts: []string{"sys"}},
		{Role: "user"},
		{Role: "assistant", Content: "a", Parts: []string{"a"}, ToolCalls: []ToolCall{
			{ID: "t1", Name: "Bash", Arguments: `{"command":"ls"}`}, {ID: "t2", Name: "Read", Arguments: "{}"},
		}},
		{Role: "tool", Content: "out", Parts: []string{"out"}, ToolCallID: "t1"},
		{Role: "tool", ToolCallID: "t2"},
		{Role: "user", Content: "Continue from where you left off.", Parts: []string{"Continue from where you left off."}},
		{Role: "user", Content: "", Parts: []string{""}},
	}
	if r := s.Requests()[0]; mustJSON(t, r.Messages) != mustJSON(t, want) || r.HasTools {
		t.Errorf("messages:\n got %s\nwant %s", mustJSON(t, r.Messages), mustJSON(t, want))
	}
}
