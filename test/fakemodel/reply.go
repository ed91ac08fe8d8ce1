package fakemodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// Reply is what the server answers to one request: Text, ToolCall, or both
// (the text first). A reply with a tool call finishes with reason
// "tool_calls", any other with "stop".
type Reply struct {
	// Text is a text answer.
	Text string
	// ToolCall is one tool call, e.g. Name "bash" with Arguments
	// `{"command": ..., "description": ...}`.
	ToolCall *ToolCall
	// Delay is how long to wait before answering (after any hold ends).
	Delay time.Duration
}

// DefaultTitle is the text DefaultScript answers a request with no tools
// (OpenCode's title request).
const DefaultTitle = "Fake session"

// DefaultFinal is the text DefaultScript answers once a tool has run.
const DefaultFinal = "done"

// DefaultScript is the script of one single-tool turn, decided from the
// request alone:
//   - a request with no tools (OpenCode's title request) gets the short text
//     DefaultTitle;
//   - a request whose last message has role "tool" gets the final text
//     DefaultFinal ("done");
//   - any other gets one bash tool call running cmd.
//
// A completed OpenCode run against it makes 3 requests: title, tool call,
// final.
func DefaultScript(cmd string) func(Request) Reply {
	args, err := json.Marshal(map[string]string{"command": cmd, "description": "Runs the scripted command"})
	if err != nil {
		panic(err) // a map of strings always marshals
	}
	return func(r Request) Reply {
		switch {
		case !r.HasTools:
			return Reply{Text: DefaultTitle}
		case r.LastMessage().Role == "tool":
			return Reply{Text: DefaultFinal}
		default:
			return Reply{ToolCall: &ToolCall{Name: "bash", Arguments: string(args)}}
		}
	}
}

func (r Reply) summary() string {
	var parts []string
	if r.Text != "" || r.ToolCall == nil {
		parts = append(parts, fmt.Sprintf("text %q", clip(r.Text, 80)))
	}
	if r.ToolCall != nil {
		parts = append(parts, fmt.Sprintf("tool call %s %s(%s)", r.ToolCall.ID, r.ToolCall.Name, clip(r.ToolCall.Arguments, 120)))
	}
	return strings.Join(parts, " + ")
}

func (r Reply) finishReason() string {
	if r.ToolCall != nil {
		return "tool_calls"
	}
	return "stop"
}

// completion is one reply on its way out.
type completion struct {
	id           string
	model        string
	created      int64
	reply        Reply
	promptTokens int
}

func (c completion) usage() map[string]any {
	out := 1 + len(c.reply.Text)/4
	if c.reply.ToolCall != nil {
		out += 1 + (len(c.reply.ToolCall.Name)+len(c.reply.ToolCall.Arguments))/4
	}
	return map[string]any{"prompt_tokens": c.promptTokens, "completion_tokens": out, "total_tokens": c.promptTokens + out}
}

// arguments is the tool call's arguments; none is "{}".
func (c completion) arguments() string {
	if c.reply.ToolCall == nil || c.reply.ToolCall.Arguments == "" {
		return "{}"
	}
	return c.reply.ToolCall.Arguments
}

// writeJSON answers with one chat.completion object.
func (c completion) writeJSON(w http.ResponseWriter) {
	msg := map[string]any{"role": "assistant", "content": nil}
	if c.reply.Text != "" || c.reply.ToolCall == nil {
		msg["content"] = c.reply.Text
	}
	if tc := c.reply.ToolCall; tc != nil {
		msg["tool_calls"] = []map[string]any{{
			"id": tc.ID, "type": "function",
			"function": map[string]any{"name": tc.Name, "arguments": c.arguments()},
		}}
	}
	writeJSONBody(w, http.StatusOK, map[string]any{
		"id": c.id, "object": "chat.completion", "created": c.created, "model": c.model,
		"choices": []map[string]any{{
			"index": 0, "message": msg, "logprobs": nil, "finish_reason": c.reply.finishReason(),
		}},
		"usage": c.usage(),
	})
}

// writeStream answers with server-sent events as OpenAI streams: a chunk
// naming the role, content deltas, a tool_calls delta (id, type and name
// first, then the arguments in pieces), a chunk with the finish reason, a
// usage chunk with no choices if includeUsage, then [DONE]. It flushes after
// every event.
func (c completion) writeStream(w http.ResponseWriter, includeUsage bool) error {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(data []byte) error {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
			return err
		}
		return rc.Flush()
	}
	chunk := func(choices []map[string]any, usage map[string]any) error {
		obj := map[string]any{
			"id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": c.model,
			"system_fingerprint": nil, "choices": choices,
		}
		if includeUsage {
			obj["usage"] = usage // null on every chunk but the last, as OpenAI does
		}
		data, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		return send(data)
	}
	delta := func(d map[string]any, finish any) error {
		return chunk([]map[string]any{{"index": 0, "delta": d, "logprobs": nil, "finish_reason": finish}}, nil)
	}

	if err := delta(map[string]any{"role": "assistant", "content": ""}, nil); err != nil {
		return err
	}
	for _, piece := range pieces(c.reply.Text, 8) {
		if err := delta(map[string]any{"content": piece}, nil); err != nil {
			return err
		}
	}
	if tc := c.reply.ToolCall; tc != nil {
		first := map[string]any{"tool_calls": []map[string]any{{
			"index": 0, "id": tc.ID, "type": "function",
			"function": map[string]any{"name": tc.Name, "arguments": ""},
		}}}
		if err := delta(first, nil); err != nil {
			return err
		}
		for _, piece := range pieces(c.arguments(), 16) {
			d := map[string]any{"tool_calls": []map[string]any{{
				"index": 0, "function": map[string]any{"arguments": piece},
			}}}
			if err := delta(d, nil); err != nil {
				return err
			}
		}
	}
	if err := delta(map[string]any{}, c.reply.finishReason()); err != nil {
		return err
	}
	if includeUsage {
		if err := chunk([]map[string]any{}, c.usage()); err != nil {
			return err
		}
	}
	return send([]byte("[DONE]"))
}

// pieces cuts s into pieces of about n bytes, never inside a UTF-8
// character.
func pieces(s string, n int) []string {
	var out []string
	for len(s) > 0 {
		cut := min(n, len(s))
		for cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut++
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return out
}

func writeJSONBody(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}

// writeError answers with an OpenAI-shaped error object.
func writeError(w http.ResponseWriter, status int, kind, msg string) {
	writeJSONBody(w, status, map[string]any{"error": map[string]any{"message": msg, "type": kind}})
}
