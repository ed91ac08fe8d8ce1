package model

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
)

// chatAPI is OpenAI chat completions, as OpenCode's @ai-sdk/openai-compatible
// provider speaks it.
var chatAPI = &api{
	name:        APIChat,
	path:        "/v1/chat/completions",
	callPrefix:  "call_",
	decode:      decodeChat,
	writeJSON:   completion.writeChatJSON,
	writeStream: completion.writeChatStream,
	fail: func(w http.ResponseWriter, status int, msg string) {
		writeError(w, status, "invalid_request_error", msg)
	},
}

func decodeChat(body []byte, req *Request) (parseOptions, error) {
	var wire struct {
		Model    string `json:"model"`
		Messages []struct {
			Role       string          `json:"role"`
			Content    json.RawMessage `json:"content"`
			ToolCallID string          `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"messages"`
		Tools []struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
		Stream        bool `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := decodeJSON(body, &wire, "a chat-completions"); err != nil {
		return parseOptions{}, err
	}
	req.Model, req.Stream = wire.Model, wire.Stream
	for _, t := range wire.Tools {
		req.Tools = append(req.Tools, cmp.Or(t.Function.Name, t.Type))
	}
	for i, wm := range wire.Messages {
		parts, err := textParts(wm.Content, "text")
		if err != nil {
			return parseOptions{}, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		m := textMessage(wm.Role, parts)
		m.ToolCallID = wm.ToolCallID
		for _, tc := range wm.ToolCalls {
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		req.Messages = append(req.Messages, m)
	}
	return parseOptions{includeUsage: wire.StreamOptions != nil && wire.StreamOptions.IncludeUsage}, nil
}

func (c completion) chatID() string { return fmt.Sprintf("chatcmpl-fake%d", c.id) }

func (c completion) chatUsage() map[string]any {
	in, out := c.tokens()
	return map[string]any{"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out}
}

func (c completion) finishReason() string {
	if c.reply.ToolCall != nil {
		return "tool_calls"
	}
	return "stop"
}

// writeChatJSON answers with one chat.completion object.
func (c completion) writeChatJSON(w http.ResponseWriter) {
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
		"id": c.chatID(), "object": "chat.completion", "created": c.created, "model": c.model,
		"choices": []map[string]any{{
			"index": 0, "message": msg, "logprobs": nil, "finish_reason": c.finishReason(),
		}},
		"usage": c.chatUsage(),
	})
}

// writeChatStream answers with server-sent events as OpenAI streams chat
// completions (data lines only, no event names): a chunk naming the role,
// content deltas, a tool_calls delta (id, type and name first, then the
// arguments in pieces), a chunk with the finish reason, a usage chunk with
// no choices if includeUsage, then [DONE].
func (c completion) writeChatStream(es *eventStream, opts parseOptions) error {
	chunk := func(choices []map[string]any, usage map[string]any) error {
		obj := map[string]any{
			"id": c.chatID(), "object": "chat.completion.chunk", "created": c.created, "model": c.model,
			"system_fingerprint": nil, "choices": choices,
		}
		if opts.includeUsage {
			obj["usage"] = usage // null on every chunk but the last, as OpenAI does
		}
		return es.send("", obj)
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
	if err := delta(map[string]any{}, c.finishReason()); err != nil {
		return err
	}
	if opts.includeUsage {
		if err := chunk([]map[string]any{}, c.chatUsage()); err != nil {
			return err
		}
	}
	return es.sendRaw("", []byte("[DONE]"))
}

// writeError answers with an OpenAI-shaped error object.
func writeError(w http.ResponseWriter, status int, kind, msg string) {
	writeJSONBody(w, status, map[string]any{"error": map[string]any{"message": msg, "type": kind}})
}
