package model

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
)

// waitLimit bounds every wait on a state in these tests: generous, never a
// speed test.
const waitLimit = 10 * time.Second

// TestMain bounds testkit.Eventually's waits by waitLimit: the server runs
// in process, so a wait that takes longer has failed.
func TestMain(m *testing.M) {
	testkit.Patience = waitLimit
	os.Exit(m.Run())
}

// start starts a server logging to t and closes it when t ends.
func start(t *testing.T, opt Options) *Server {
	t.Helper()
	if opt.Logf == nil {
		opt.Logf = t.Logf
	}
	s := New(opt)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// msg is a message as a client sends it.
type msg map[string]any

// chatBody is a chat-completions request body.
func chatBody(stream, includeUsage, tools bool, msgs ...msg) []byte {
	body := map[string]any{"model": "fake-model", "messages": msgs, "stream": stream}
	if includeUsage {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	if tools {
		body["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{
			"name": "bash", "parameters": map[string]any{"type": "object"},
		}}}
		body["tool_choice"] = "auto"
	}
	data, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return data
}

func user(text string) msg { return msg{"role": "user", "content": text} }

// toolTurn is a history that ends with a tool result.
func toolTurn(output string) []msg {
	return []msg{
		{"role": "system", "content": "be brief"},
		user("run it"),
		{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{
			"id": "call_1", "type": "function",
			"function": map[string]any{"name": "bash", "arguments": `{"command":"echo x"}`},
		}}},
		{"role": "tool", "tool_call_id": "call_1", "content": output},
	}
}

func post(ctx context.Context, url string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

// mustPost posts body and returns the response's status and body.
func mustPost(t *testing.T, url string, body []byte) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	res, err := post(ctx, url, body)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, data
}

// sseEvent is one server-sent event: its name ("" with no event line) and
// its data.
type sseEvent struct {
	name, data string
}

// readEvents reads server-sent events: an optional "event: NAME" line,
// then "data: ..." lines, each event ended by a blank line. It fails on any
// other line, on an event with no data and on an unended event.
func readEvents(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	br := bufio.NewReader(r)
	var events []sseEvent
	var name string
	var data []string
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" {
			break
		}
		if err != nil {
			t.Fatalf("SSE: %v (partial line %q)", err, line)
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if data == nil {
				t.Fatalf("SSE: blank line with no data before it (after %d events)", len(events))
			}
			events = append(events, sseEvent{name, strings.Join(data, "\n")})
			name, data = "", nil
		case strings.HasPrefix(line, "event: ") && name == "" && data == nil:
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		default:
			t.Fatalf("SSE: unexpected line %q", line)
		}
	}
	if data != nil || name != "" {
		t.Fatalf("SSE: the stream ended inside an event: %q %q", name, data)
	}
	return events
}

// readSSE reads server-sent events with no names (chat completions') and
// returns their data.
func readSSE(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	for i, ev := range readEvents(t, r) {
		if ev.name != "" {
			t.Fatalf("SSE: event %d is named %q", i, ev.name)
		}
		out = append(out, ev.data)
	}
	return out
}

// chunk is a chat.completion.chunk as a client decodes it.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role      *string `json:"role"`
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    *int   `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string  `json:"name"`
					Arguments *string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// stream is a streamed reply, checked for shape and put together.
type stream struct {
	chunks    []chunk
	text      string
	toolCalls []ToolCall
	finish    string
	usage     *usage
}

// readStream reads a streamed reply and checks its shape: SSE events, every
// one a chat.completion.chunk of one id and model, the role first, one
// finish reason on the last choice chunk, a usage chunk with no choices iff
// includeUsage (and "usage" present on every chunk iff includeUsage), then
// [DONE] and nothing after.
func readStream(t *testing.T, res *http.Response, includeUsage bool) stream {
	t.Helper()
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, data)
	}
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q, want text/event-stream", ct)
	}
	if res.ContentLength != -1 {
		t.Errorf("ContentLength %d: the reply was not streamed", res.ContentLength)
	}
	events := readSSE(t, res.Body)
	if len(events) < 3 {
		t.Fatalf("%d events: %q", len(events), events)
	}
	if last := events[len(events)-1]; last != "[DONE]" {
		t.Fatalf("last event %q, want [DONE]", last)
	}
	var st stream
	var args []strings.Builder
	for i, ev := range events[:len(events)-1] {
		if ev == "[DONE]" {
			t.Fatalf("event %d is [DONE] before the end", i)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(ev), &raw); err != nil {
			t.Fatalf("event %d %q: %v", i, ev, err)
		}
		if _, ok := raw["usage"]; ok != includeUsage {
			t.Errorf("event %d: usage key present %t, want %t: %s", i, ok, includeUsage, ev)
		}
		var c chunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %d %q: %v", i, ev, err)
		}
		if c.Object != "chat.completion.chunk" || c.ID == "" || c.Created == 0 || c.Model != "fake-model" {
			t.Errorf("event %d: object %q id %q created %d model %q", i, c.Object, c.ID, c.Created, c.Model)
		}
		if i > 0 && c.ID != st.chunks[0].ID {
			t.Errorf("event %d: id %q, first was %q", i, c.ID, st.chunks[0].ID)
		}
		st.chunks = append(st.chunks, c)
		if len(c.Choices) == 0 {
			if c.Usage == nil {
				t.Errorf("event %d: no choices and no usage: %s", i, ev)
			}
			st.usage = c.Usage
			continue
		}
		if st.usage != nil || c.Usage != nil {
			t.Errorf("event %d: usage before the last chunk: %s", i, ev)
		}
		if len(c.Choices) != 1 || c.Choices[0].Index != 0 {
			t.Fatalf("event %d: choices %s", i, raw["choices"])
		}
		if st.finish != "" {
			t.Errorf("event %d: a choice after the finish reason: %s", i, ev)
		}
		ch := c.Choices[0]
		if (i == 0) != (ch.Delta.Role != nil) {
			t.Errorf("event %d: role %v; want the role in the first chunk only", i, ch.Delta.Role)
		}
		if ch.Delta.Role != nil && *ch.Delta.Role != "assistant" {
			t.Errorf("event %d: role %q", i, *ch.Delta.Role)
		}
		if ch.Delta.Content != nil {
			st.text += *ch.Delta.Content
		}
		for _, tc := range ch.Delta.ToolCalls {
			if tc.Index == nil {
				t.Fatalf("event %d: a tool call delta with no index: %s", i, ev)
			}
			switch {
			case *tc.Index == len(st.toolCalls):
				if tc.ID == "" || tc.Type != "function" || tc.Function.Name == "" || tc.Function.Arguments == nil {
					t.Errorf("event %d: first delta of tool call %d lacks id, type function, name or arguments: %s", i, *tc.Index, ev)
				}
				st.toolCalls = append(st.toolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name})
				args = append(args, strings.Builder{})
			case *tc.Index >= len(st.toolCalls):
				t.Fatalf("event %d: tool call index %d out of order", i, *tc.Index)
			case tc.ID != "" || tc.Function.Name != "":
				t.Errorf("event %d: a later delta of tool call %d repeats its id or name: %s", i, *tc.Index, ev)
			}
			if tc.Function.Arguments != nil {
				args[*tc.Index].WriteString(*tc.Function.Arguments)
			}
		}
		if ch.FinishReason != nil {
			st.finish = *ch.FinishReason
			if string(raw["choices"]) != `[{"delta":{},"finish_reason":"`+st.finish+`","index":0,"logprobs":null}]` {
				t.Errorf("event %d: finish chunk %s", i, raw["choices"])
			}
		}
	}
	for i := range st.toolCalls {
		st.toolCalls[i].Arguments = args[i].String()
	}
	if st.finish == "" {
		t.Error("no finish reason")
	}
	if includeUsage && st.usage == nil {
		t.Error("include_usage asked and no usage chunk")
	}
	if st.usage != nil && (st.usage.PromptTokens <= 0 || st.usage.CompletionTokens <= 0 || st.usage.TotalTokens != st.usage.PromptTokens+st.usage.CompletionTokens) {
		t.Errorf("usage %+v", *st.usage)
	}
	return st
}

// fetched is a response read whole, or the error that ended it.
type fetched struct {
	res *http.Response
	err error
}

// fetch posts body and reads the whole response, without failing the test:
// for goroutines, which must not call t.Fatal. The response's Body reads
// the bytes read.
func fetch(url string, body []byte) fetched {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	res, err := post(ctx, url, body)
	if err != nil {
		return fetched{err: err}
	}
	data, err := io.ReadAll(res.Body)
	res.Body.Close()
	res.Body = io.NopCloser(bytes.NewReader(data))
	return fetched{res, err}
}

// stream checks a fetched streamed reply.
func (f fetched) stream(t *testing.T, includeUsage bool) stream {
	t.Helper()
	if f.err != nil {
		t.Fatal(f.err)
	}
	return readStream(t, f.res, includeUsage)
}

func streamPost(t *testing.T, url string, body []byte, includeUsage bool) stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	res, err := post(ctx, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return readStream(t, res, includeUsage)
}

// TestStreamTitle: a streamed request with no tools (OpenCode's title
// request) gets DefaultTitle as content deltas, finish reason stop, a usage
// chunk since it asked for one, and [DONE].
func TestStreamTitle(t *testing.T) {
	s := start(t, Options{Script: DefaultScript("echo x")})
	st := streamPost(t, s.URL()+"/v1/chat/completions", chatBody(true, true, false, user("Generate a title"), user("hi")), true)
	if st.text != DefaultTitle || st.finish != "stop" || len(st.toolCalls) != 0 {
		t.Errorf("text %q finish %q tool calls %v", st.text, st.finish, st.toolCalls)
	}
	contentChunks := 0
	for _, c := range st.chunks[1:] {
		if len(c.Choices) == 1 && c.Choices[0].Delta.Content != nil {
			contentChunks++
		}
	}
	if contentChunks < 2 {
		t.Errorf("the text came in %d content deltas, want it in pieces", contentChunks)
	}
}

// TestStreamToolCall: a streamed request with tools and a user message last
// gets one bash tool call (first delta with index, id, type, name; the
// arguments in pieces that put together the command), finish reason
// tool_calls, and no usage key anywhere since it asked for none.
func TestStreamToolCall(t *testing.T) {
	s := start(t, Options{Script: DefaultScript(`echo "hi there" ünïcode`)})
	st := streamPost(t, s.URL()+"/v1/chat/completions", chatBody(true, false, true, user("run the tool")), false)
	if st.finish != "tool_calls" || st.text != "" || len(st.toolCalls) != 1 {
		t.Fatalf("finish %q text %q tool calls %+v", st.finish, st.text, st.toolCalls)
	}
	tc := st.toolCalls[0]
	if tc.Name != "bash" || !strings.HasPrefix(tc.ID, "call_") {
		t.Errorf("tool call %+v", tc)
	}
	var args map[string]string
	if err := json.Unmarshal([]byte(tc.Arguments), &args); err != nil {
		t.Fatalf("arguments %q: %v", tc.Arguments, err)
	}
	if args["command"] != `echo "hi there" ünïcode` || args["description"] == "" || len(args) != 2 {
		t.Errorf("arguments %q", tc.Arguments)
	}
	argChunks := 0
	for _, c := range st.chunks {
		if len(c.Choices) == 1 && len(c.Choices[0].Delta.ToolCalls) == 1 {
			argChunks++
		}
	}
	if argChunks < 3 {
		t.Errorf("the tool call came in %d deltas, want the arguments in pieces", argChunks)
	}
}

// TestStreamFinal: a request whose last message is a tool result gets the
// final text "done" and finish reason stop.
func TestStreamFinal(t *testing.T) {
	s := start(t, Options{Script: DefaultScript("echo x")})
	st := streamPost(t, s.URL()+"/v1/chat/completions", chatBody(true, true, true, toolTurn("x\n")...), true)
	if st.text != "done" || st.finish != "stop" || len(st.toolCalls) != 0 {
		t.Errorf("text %q finish %q tool calls %v", st.text, st.finish, st.toolCalls)
	}
}

// TestStreamTextAndToolCall: a reply with both text and a tool call (and a
// tool call id of the script's own) streams the text, then the call.
func TestStreamTextAndToolCall(t *testing.T) {
	s := start(t, Options{Script: func(Request) Reply {
		return Reply{Text: "let me look", ToolCall: &ToolCall{ID: "call_mine", Name: "read", Arguments: `{"path":"a"}`}}
	}})
	st := streamPost(t, s.URL()+"/v1/chat/completions", chatBody(true, true, true, user("x")), true)
	if st.text != "let me look" || st.finish != "tool_calls" || len(st.toolCalls) != 1 ||
		st.toolCalls[0] != (ToolCall{ID: "call_mine", Name: "read", Arguments: `{"path":"a"}`}) {
		t.Errorf("text %q finish %q tool calls %+v", st.text, st.finish, st.toolCalls)
	}
	text, tool := -1, -1
	for i, c := range st.chunks {
		if len(c.Choices) == 1 && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" && text < 0 {
			text = i
		}
		if len(c.Choices) == 1 && len(c.Choices[0].Delta.ToolCalls) > 0 && tool < 0 {
			tool = i
		}
	}
	if text < 0 || tool < text {
		t.Errorf("first text chunk %d, first tool chunk %d: want the text first", text, tool)
	}
}

// completionObject is a chat.completion as a client decodes it.
type completionObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role      string  `json:"role"`
			Content   *string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func postCompletion(t *testing.T, url string, body []byte) completionObject {
	t.Helper()
	res, data := mustPost(t, url, body)
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q: %s", res.StatusCode, res.Header.Get("Content-Type"), data)
	}
	var c completionObject
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	if c.Object != "chat.completion" || c.ID == "" || c.Model != "fake-model" || len(c.Choices) != 1 || c.Choices[0].Index != 0 ||
		c.Choices[0].Message.Role != "assistant" || c.Usage == nil || c.Usage.TotalTokens <= 0 {
		t.Errorf("completion %s", data)
	}
	return c
}

// TestNonStream: without stream, each of the three default replies is one
// chat.completion object: text with content and finish reason stop, a tool
// call with null content, tool_calls and finish reason tool_calls.
func TestNonStream(t *testing.T) {
	s := start(t, Options{Script: DefaultScript("echo hello")})
	url := s.URL() + "/v1/chat/completions"

	title := postCompletion(t, url, chatBody(false, false, false, user("hi")))
	if m := title.Choices[0].Message; m.Content == nil || *m.Content != DefaultTitle || len(m.ToolCalls) != 0 || title.Choices[0].FinishReason != "stop" {
		t.Errorf("title %+v", title.Choices[0])
	}

	call := postCompletion(t, url, chatBody(false, false, true, user("run")))
	m := call.Choices[0].Message
	if m.Content != nil || len(m.ToolCalls) != 1 || call.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("tool call %+v", call.Choices[0])
	}
	tc := m.ToolCalls[0]
	if tc.ID == "" || tc.Type != "function" || tc.Function.Name != "bash" || !strings.Contains(tc.Function.Arguments, `"command":"echo hello"`) {
		t.Errorf("tool call %+v", tc)
	}

	final := postCompletion(t, url, chatBody(false, false, true, toolTurn("hello\n")...))
	if m := final.Choices[0].Message; m.Content == nil || *m.Content != "done" || final.Choices[0].FinishReason != "stop" {
		t.Errorf("final %+v", final.Choices[0])
	}
	if ids := []string{title.ID, call.ID, final.ID}; ids[0] == ids[1] || ids[1] == ids[2] || ids[0] == ids[2] {
		t.Errorf("completion ids not unique: %q", ids)
	}
}

// TestRequestParsing: a request is recorded with its path, model, stream
// flag, tools flag, raw body, arrival time, and its messages: string, null
// and array content as text, tool calls and tool call ids.
func TestRequestParsing(t *testing.T) {
	s := start(t, Options{})
	msgs := append(toolTurn("out\n"),
		msg{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "part one"},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:x"}},
			map[string]any{"type": "text", "text": "part two"},
		}},
		msg{"role": "assistant", "content": nil},
	)
	body := chatBody(false, false, true, msgs...)
	before := time.Now()
	postCompletion(t, s.URL()+"/v1/chat/completions", body)
	reqs := s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	if r.Path != "/v1/chat/completions" || r.Rollout != "" || r.Attempt != 0 || r.Model != "fake-model" || !r.HasTools || r.Stream {
		t.Errorf("request %+v", r)
	}
	if !bytes.Equal(r.Body, body) {
		t.Errorf("body %s, sent %s", r.Body, body)
	}
	if r.Received.Before(before) || r.Received.After(time.Now()) {
		t.Errorf("received %v, sent at %v", r.Received, before)
	}
	want := []Message{
		{Role: "system", Content: "be brief"},
		{Role: "user", Content: "run it"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Name: "bash", Arguments: `{"command":"echo x"}`}}},
		{Role: "tool", Content: "out\n", ToolCallID: "call_1"},
		{Role: "user", Content: "part one\npart two"},
		{Role: "assistant"},
	}
	if len(r.Messages) != len(want) {
		t.Fatalf("messages %+v", r.Messages)
	}
	for i := range want {
		if !messageEqual(r.Messages[i], want[i]) {
			t.Errorf("message %d: %+v, want %+v", i, r.Messages[i], want[i])
		}
	}
	if r.LastMessage().Role != "assistant" || (Request{}).LastMessage().Role != "" {
		t.Error("LastMessage")
	}
}

func messageEqual(a, b Message) bool {
	return a.Role == b.Role && a.Content == b.Content && a.ToolCallID == b.ToolCallID && slices.Equal(a.ToolCalls, b.ToolCalls)
}

// TestRolloutPrefix: under /ng-rollout/<segment>/, Rollout is the whole
// segment and Attempt the N of a trailing -a<N>; the models list answers
// under the prefix too.
func TestRolloutPrefix(t *testing.T) {
	s := start(t, Options{})
	cases := []struct {
		segment string
		attempt int
	}{
		{"r1", 0},
		{"r1-a2", 2},
		{"run-7-a13", 13},
		{"x-a", 0},
		{"-a3", 0},
		{"r1-a2-b", 0},
		{"r1-A2", 0},
	}
	for i, c := range cases {
		path := "/ng-rollout/" + c.segment + "/v1/chat/completions"
		st := streamPost(t, s.URL()+path, chatBody(true, false, false, user("hi")), false)
		if st.text != DefaultTitle {
			t.Errorf("%s: text %q", path, st.text)
		}
		r := s.Requests()[i]
		if r.Path != path || r.Rollout != c.segment || r.Attempt != c.attempt {
			t.Errorf("%s: path %q rollout %q attempt %d, want rollout %q attempt %d", path, r.Path, r.Rollout, r.Attempt, c.segment, c.attempt)
		}
	}
	for _, path := range []string{"/v1/models", "/ng-rollout/r1-a2/v1/models"} {
		res, err := http.Get(s.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Object string `json:"object"`
			Data   []struct {
				ID, Object string
			} `json:"data"`
		}
		err = json.NewDecoder(res.Body).Decode(&list)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK || list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != DefaultModel || list.Data[0].Object != "model" {
			t.Errorf("GET %s: status %d, %+v, %v", path, res.StatusCode, list, err)
		}
	}
}

// TestBadRoutesAndBodies: unknown routes answer 404 and bodies that are not
// chat-completions requests 400, both as OpenAI error objects, and neither
// is recorded.
func TestBadRoutesAndBodies(t *testing.T) {
	s := start(t, Options{Model: "other-model"})
	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/v1/completions", "{}", 404},
		{"GET", "/v1/chat/completions", "", 404},
		{"POST", "/ng-rollout/r1/v2/chat/completions", "{}", 404},
		{"POST", "/ng-rollout//v1/chat/completions", "{}", 404},
		{"POST", "/v1/chat/completions", "not json", 400},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":7}]}`, 400},
		{"POST", "/v1/chat/completions", `{"messages":"no"}`, 400},
	} {
		req, _ := http.NewRequest(c.method, s.URL()+c.path, strings.NewReader(c.body))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Message, Type string } `json:"error"`
		}
		err = json.NewDecoder(res.Body).Decode(&e)
		res.Body.Close()
		if res.StatusCode != c.status || err != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s %s %q: status %d, error %+v (%v), want %d", c.method, c.path, c.body, res.StatusCode, e, err, c.status)
		}
	}
	if n := len(s.Requests()); n != 0 {
		t.Errorf("%d requests recorded", n)
	}
	res, err := http.Get(s.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(data), `"id":"other-model"`) {
		t.Errorf("models with Options.Model: %s", data)
	}
}

// TestConcurrentWhileHeld: with the main turn held (Holdable picks requests
// with tools), a title request sent beside it is answered at once, as
// OpenCode needs; the held one answers after Release.
func TestConcurrentWhileHeld(t *testing.T) {
	s := start(t, Options{Holdable: func(r Request) bool { return r.HasTools }})
	s.Hold(1)
	url := s.URL() + "/v1/chat/completions"
	mainDone := make(chan fetched, 1)
	go func() { mainDone <- fetch(url, chatBody(true, true, true, user("run"))) }()
	testkit.Eventually(t, "the main turn held", func() (bool, string) { return s.Held() == 1, "" })

	st := streamPost(t, url, chatBody(true, true, false, user("title")), true)
	if st.text != DefaultTitle {
		t.Errorf("title %q", st.text)
	}
	if s.Held() != 1 {
		t.Errorf("held %d after the title request", s.Held())
	}
	select {
	case <-mainDone:
		t.Fatal("the held request was answered before Release")
	default:
	}
	s.Release()
	select {
	case f := <-mainDone:
		if st := f.stream(t, true); st.finish != "tool_calls" {
			t.Errorf("main turn finished %q", st.finish)
		}
	case <-time.After(waitLimit):
		t.Fatal("the held request was not answered after Release")
	}
}

// TestHoldRelease: Hold(2) holds exactly the next two of three concurrent
// requests (each logged and recorded on arrival), answers the third at once,
// delivers both on Release, and holds nothing new after.
func TestHoldRelease(t *testing.T) {
	var logs logRecorder
	s := start(t, Options{Logf: logs.logf(t)})
	url := s.URL() + "/v1/chat/completions"
	s.Hold(2)
	var wg sync.WaitGroup
	var answered atomic.Int32
	results := make(chan fetched, 3)
	for range 3 {
		wg.Go(func() {
			f := fetch(url, chatBody(true, false, false, user("x")))
			answered.Add(1)
			results <- f
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := s.WaitRequests(ctx, 3); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "two held and one answered", func() (bool, string) { return s.Held() == 2 && answered.Load() == 1, "" })
	if n := logs.count(" held"); n != 2 {
		t.Errorf("%d 'held' log lines, want 2", n)
	}
	time.Sleep(200 * time.Millisecond)
	if n := answered.Load(); n != 1 {
		t.Fatalf("%d answered while two are held", n)
	}
	s.Release()
	if s.Held() != 0 {
		t.Errorf("held %d right after Release", s.Held())
	}
	wg.Wait()
	close(results)
	for f := range results {
		if st := f.stream(t, false); st.text != DefaultTitle {
			t.Errorf("text %q", st.text)
		}
	}
	// Release stopped the holding: a fourth request is answered at once.
	st := streamPost(t, url, chatBody(true, false, false, user("x")), false)
	if st.text != DefaultTitle || s.Held() != 0 || len(s.Requests()) != 4 {
		t.Errorf("after Release: text %q held %d requests %d", st.text, s.Held(), len(s.Requests()))
	}
}

// TestHoldCounts: a second Hold replaces the count left, Hold(0) stops
// holding, and a non-holdable request neither waits nor uses up the count.
func TestHoldCounts(t *testing.T) {
	s := start(t, Options{Holdable: func(r Request) bool { return r.HasTools }})
	url := s.URL() + "/v1/chat/completions"
	s.Hold(5)
	s.Hold(0)
	postCompletion(t, url, chatBody(false, false, true, user("x"))) // not held
	s.Hold(1)
	postCompletion(t, url, chatBody(false, false, false, user("title"))) // not holdable
	done := make(chan fetched, 1)
	go func() { done <- fetch(url, chatBody(false, false, true, user("x"))) }()
	testkit.Eventually(t, "one held", func() (bool, string) { return s.Held() == 1, "" })
	postCompletion(t, url, chatBody(false, false, true, user("x"))) // the count is used up
	s.Release()
	if f := <-done; f.err != nil || f.res.StatusCode != http.StatusOK {
		t.Errorf("the held request: %v", f.err)
	}
	if n := len(s.Requests()); n != 4 {
		t.Errorf("%d requests", n)
	}
}

// TestHeldClientGone: a held request whose client goes away is logged and
// no longer counted as held, and releases cleanly.
func TestHeldClientGone(t *testing.T) {
	var logs logRecorder
	s := start(t, Options{Logf: logs.logf(t)})
	s.Hold(1)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		res, err := post(ctx, s.URL()+"/v1/chat/completions", chatBody(true, false, false, user("x")))
		if err == nil {
			res.Body.Close()
		}
		errc <- err
	}()
	testkit.Eventually(t, "held", func() (bool, string) { return s.Held() == 1, "" })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client error %v", err)
	}
	testkit.Eventually(t, "the hold ended", func() (bool, string) { return s.Held() == 0 && logs.count("client went away") == 1, "" })
	s.Release()
	if s.Held() != 0 || len(s.Requests()) != 1 {
		t.Errorf("held %d requests %d", s.Held(), len(s.Requests()))
	}
}

// TestWaitRequests: WaitRequests returns at once when enough requests have
// come, wakes when the n-th arrives, and fails with the context's error on
// time out and with an error once the server closes.
func TestWaitRequests(t *testing.T) {
	s := New(Options{Logf: t.Logf})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	url := s.URL() + "/v1/chat/completions"
	bg := context.Background()
	if err := s.WaitRequests(bg, 0); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	if err := s.WaitRequests(short, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with no request: %v", err)
	}

	ctx, cancel2 := context.WithTimeout(bg, waitLimit)
	defer cancel2()
	waited := make(chan error, 1)
	go func() { waited <- s.WaitRequests(ctx, 2) }()
	postCompletion(t, url, chatBody(false, false, false, user("x")))
	select {
	case err := <-waited:
		t.Fatalf("returned %v after 1 of 2 requests", err)
	case <-time.After(100 * time.Millisecond):
	}
	postCompletion(t, url, chatBody(false, false, false, user("x")))
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if err := s.WaitRequests(bg, 2); err != nil {
		t.Fatal(err)
	}

	go func() { waited <- s.WaitRequests(ctx, 3) }()
	time.Sleep(50 * time.Millisecond)
	s.Close()
	if err := <-waited; err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("after Close: %v", err)
	}
}

// errGotReply marks a reply where none was due.
var errGotReply = errors.New("got a reply")

// TestCloseWhileHeld: Close wakes held requests (their clients get no
// reply), returns, and Logf is never called after it returns.
func TestCloseWhileHeld(t *testing.T) {
	var closed atomic.Bool
	s := New(Options{Logf: func(format string, args ...any) {
		if closed.Load() {
			panic("Logf after Close: " + fmt.Sprintf(format, args...))
		}
		t.Logf(format, args...)
	}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	s.Hold(3)
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			res, err := post(ctx, s.URL()+"/v1/chat/completions", chatBody(true, false, false, user("x")))
			if err == nil {
				data, _ := io.ReadAll(res.Body)
				res.Body.Close()
				err = fmt.Errorf("%w: status %d: %q", errGotReply, res.StatusCode, data)
			}
			errs <- err
		}()
	}
	testkit.Eventually(t, "three held", func() (bool, string) { return s.Held() == 3, "" })
	t0 := time.Now()
	s.Close()
	closed.Store(true)
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
	for range 3 {
		err := <-errs
		if errors.Is(err, errGotReply) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a held client got %v, want the connection closed", err)
		}
	}
	s.Close() // twice is fine
	if err := s.Start(); err == nil {
		t.Error("Start after Close succeeded")
	}
}

// TestDelay: a reply's Delay holds its answer back that long.
func TestDelay(t *testing.T) {
	s := start(t, Options{Script: func(Request) Reply { return Reply{Text: "late", Delay: 300 * time.Millisecond} }})
	t0 := time.Now()
	st := streamPost(t, s.URL()+"/v1/chat/completions", chatBody(true, false, false, user("x")), false)
	if d := time.Since(t0); d < 300*time.Millisecond || st.text != "late" {
		t.Errorf("answered %q after %v", st.text, d)
	}
}

// TestStartAndURL: URL is empty before Start and the loopback address
// after; a second Start fails.
func TestStartAndURL(t *testing.T) {
	s := New(Options{})
	if s.URL() != "" {
		t.Errorf("URL before Start %q", s.URL())
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") {
		t.Errorf("URL %q", s.URL())
	}
	if err := s.Start(); err == nil {
		t.Error("second Start succeeded")
	}
}

// TestPieces: pieces cut text without splitting a UTF-8 character and put
// it back together whole.
func TestPieces(t *testing.T) {
	for _, s := range []string{"", "a", "ünïcödé ✓ text", strings.Repeat("日本", 20)} {
		ps := pieces(s, 3)
		if strings.Join(ps, "") != s {
			t.Errorf("%q -> %q", s, ps)
		}
		for _, p := range ps {
			if p == "" {
				t.Errorf("%q: empty piece", s)
			}
			if strings.ToValidUTF8(p, "\uFFFD") != p {
				t.Errorf("%q: piece %q splits a character", s, p)
			}
		}
	}
}

// logRecorder keeps the log lines of a server and passes them on to t.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (l *logRecorder) logf(t *testing.T) func(string, ...any) {
	return func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		l.mu.Lock()
		l.lines = append(l.lines, line)
		l.mu.Unlock()
		t.Log(line)
	}
}

// count is how many lines contain s.
func (l *logRecorder) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// TestSentMessages: a request's conversation comes back as sent, each
// message byte for byte (spacing and key order kept), and the rest of the
// body without the array; on the Responses API the conversation is
// "input". A body without it, or whose array is no array, is an error.
func TestSentMessages(t *testing.T) {
	body := `{"model":"m", "messages":[ {"role":"user","content":"a b"} ,{"content":null,"role":"assistant"}],"stream":true}`
	msgs, rest, err := Request{API: APIChat, Body: json.RawMessage(body)}.SentMessages()
	if err != nil || len(msgs) != 2 || string(msgs[0]) != `{"role":"user","content":"a b"}` || string(msgs[1]) != `{"content":null,"role":"assistant"}` ||
		string(rest) != `{"model":"m", "messages":,"stream":true}` {
		t.Errorf("chat: %q, rest %q, %v", msgs, rest, err)
	}
	msgs, rest, err = Request{API: APIResponses, Body: json.RawMessage(`{"input":[{"type":"message"}],"messages":[]}`)}.SentMessages()
	if err != nil || len(msgs) != 1 || string(rest) != `{"input":,"messages":[]}` {
		t.Errorf("responses: %q, rest %q, %v", msgs, rest, err)
	}
	for _, body := range []string{`{"model":"m"}`, `{"messages":{}}`, `[1]`} {
		if _, _, err := (Request{API: APIMessages, Body: json.RawMessage(body)}).SentMessages(); err == nil {
			t.Errorf("%s: no error", body)
		}
	}
}
