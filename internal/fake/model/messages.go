package model

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// messagesAPI is the Anthropic Messages API as Claude Code speaks it (see
// the package doc for what is followed).
var messagesAPI = &api{
	name:        APIMessages,
	path:        "/v1/messages",
	callPrefix:  "toolu_",
	decode:      decodeMessages,
	writeJSON:   completion.writeMessageJSON,
	writeStream: completion.writeMessageStream,
	fail: func(w http.ResponseWriter, status int, msg string) {
		writeJSONBody(w, status, map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": msg}})
	},
}

func decodeMessages(body []byte, req *Request) (parseOptions, error) {
	var wire struct {
		Model    string          `json:"model"`
		System   json.RawMessage `json:"system"`
		Messages *[]struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"tools"`
		Stream bool `json:"stream"`
	}
	if err := decodeJSON(body, &wire, "a Messages"); err != nil {
		return parseOptions{}, err
	}
	if wire.Messages == nil {
		return parseOptions{}, errors.New("the request has no messages")
	}
	req.Model, req.Stream = wire.Model, wire.Stream
	for _, t := range wire.Tools {
		req.Tools = append(req.Tools, cmp.Or(t.Name, t.Type))
	}
	system, err := textParts(wire.System, "text")
	if err != nil {
		return parseOptions{}, fmt.Errorf("system: %w", err)
	}
	if len(system) > 0 {
		req.Messages = append(req.Messages, textMessage("system", system))
	}
	for i, wm := range *wire.Messages {
		switch wm.Role {
		case "user", "assistant", "system":
		default:
			return parseOptions{}, fmt.Errorf("messages[%d].role is %q, not user, assistant or system", i, wm.Role)
		}
		msgs, err := messagesContent(wm.Role, wm.Content)
		if err != nil {
			return parseOptions{}, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		req.Messages = append(req.Messages, msgs...)
	}
	return parseOptions{}, nil
}

// messagesContent normalises one Messages message: its text blocks and
// tool_use blocks make one message of its role; each tool_result block
// becomes a tool message, in order (a user message's text after its tool
// results follows them as a user message). Other blocks (images,
// thinking, ...) are left out; a message left with nothing is kept empty.
func messagesContent(role string, raw json.RawMessage) ([]Message, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		parts, err := textParts(raw, "text")
		if err != nil {
			return nil, err
		}
		return []Message{textMessage(role, parts)}, nil
	}
	var blocks []struct {
		Type      string          `json:"type"`
		Text      string          `json:"text"`
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
		ToolUseID string          `json:"tool_use_id"`
		Content   json.RawMessage `json:"content"`
		IsError   bool            `json:"is_error"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, err
	}
	var out []Message
	var parts []string
	var calls []ToolCall
	flush := func() {
		if len(parts) > 0 || len(calls) > 0 {
			m := textMessage(role, parts)
			m.ToolCalls = calls
			out = append(out, m)
		}
		parts, calls = nil, nil
	}
	for i, b := range blocks {
		switch b.Type {
		case "text":
			parts = append(parts, b.Text)
		case "tool_use":
			args := "{}"
			if len(b.Input) > 0 {
				var buf bytes.Buffer
				if err := json.Compact(&buf, b.Input); err != nil {
					return nil, fmt.Errorf("[%d].input: %w", i, err)
				}
				args = buf.String()
			}
			calls = append(calls, ToolCall{ID: b.ID, Name: b.Name, Arguments: args})
		case "tool_result":
			if b.ToolUseID == "" {
				return nil, fmt.Errorf("[%d]: a tool_result with no tool_use_id", i)
			}
			flush()
			res, err := textParts(b.Content, "text")
			if err != nil {
				return nil, fmt.Errorf("[%d].content: %w", i, err)
			}
			m := textMessage("tool", res)
			m.ToolCallID, m.IsError = b.ToolUseID, b.IsError
			out = append(out, m)
		}
	}
	flush()
	if len(out) == 0 {
		out = append(out, Message{Role: role})
	}
	return out, nil
}

func (c completion) messageID() string { return fmt.Sprintf("msg_fake%d", c.id) }

func (c completion) stopReason() string {
	if c.reply.ToolCall != nil {
		return "tool_use"
	}
	return "end_turn"
}

func (c completion) messageUsage(out int) map[string]any {
	in, _ := c.tokens()
	return map[string]any{"input_tokens": in, "output_tokens": out, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
}

// message is the message object; done, with its content, stop reason and
// output tokens; else as message_start carries it.
func (c completion) message(done bool) map[string]any {
	m := map[string]any{
		"id": c.messageID(), "type": "message", "role": "assistant", "model": c.model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": c.messageUsage(1),
	}
	if done {
		_, out := c.tokens()
		var blocks []any
		if c.hasText() {
			blocks = append(blocks, map[string]any{"type": "text", "text": c.reply.Text})
		}
		if tc := c.reply.ToolCall; tc != nil {
			blocks = append(blocks, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Name, "input": json.RawMessage(c.arguments())})
		}
		m["content"], m["stop_reason"], m["usage"] = blocks, c.stopReason(), c.messageUsage(out)
	}
	return m
}

// writeMessageJSON answers with one message object.
func (c completion) writeMessageJSON(w http.ResponseWriter) {
	writeJSONBody(w, http.StatusOK, c.message(true))
}

// writeMessageStream answers with the Messages API's events, each named by
// an event line and carrying its type: message_start, ping; for text,
// content_block_start (an empty text block), text_delta pieces,
// content_block_stop; for a tool call, content_block_start (a tool_use
// block with input {}), input_json_delta pieces, content_block_stop; then
// message_delta (stop_reason tool_use or end_turn, output tokens) and
// message_stop.
func (c completion) writeMessageStream(es *eventStream, _ parseOptions) error {
	send := func(typ string, fields map[string]any) error {
		fields["type"] = typ
		return es.send(typ, fields)
	}
	if err := send("message_start", map[string]any{"message": c.message(false)}); err != nil {
		return err
	}
	if err := send("ping", map[string]any{}); err != nil {
		return err
	}
	index := 0
	block := func(start map[string]any, deltas []map[string]any) error {
		if err := send("content_block_start", map[string]any{"index": index, "content_block": start}); err != nil {
			return err
		}
		for _, d := range deltas {
			if err := send("content_block_delta", map[string]any{"index": index, "delta": d}); err != nil {
				return err
			}
		}
		if err := send("content_block_stop", map[string]any{"index": index}); err != nil {
			return err
		}
		index++
		return nil
	}
	if c.hasText() {
		var deltas []map[string]any
		for _, piece := range pieces(c.reply.Text, 8) {
			deltas = append(deltas, map[string]any{"type": "text_delta", "text": piece})
		}
		if err := block(map[string]any{"type": "text", "text": ""}, deltas); err != nil {
			return err
		}
	}
	if tc := c.reply.ToolCall; tc != nil {
		var deltas []map[string]any
		for _, piece := range pieces(c.arguments(), 16) {
			deltas = append(deltas, map[string]any{"type": "input_json_delta", "partial_json": piece})
		}
		start := map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Name, "input": map[string]any{}}
		if err := block(start, deltas); err != nil {
			return err
		}
	}
	_, out := c.tokens()
	if err := send("message_delta", map[string]any{
		"delta": map[string]any{"stop_reason": c.stopReason(), "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": out},
	}); err != nil {
		return err
	}
	return send("message_stop", map[string]any{})
}
