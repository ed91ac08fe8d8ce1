package model

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// responsesAPI is the OpenAI Responses API as Codex CLI speaks it (see the
// package doc for what is followed).
var responsesAPI = &api{
	name:        APIResponses,
	path:        "/v1/responses",
	callPrefix:  "call_",
	decode:      decodeResponses,
	writeJSON:   completion.writeResponseJSON,
	writeStream: completion.writeResponseStream,
	fail: func(w http.ResponseWriter, status int, msg string) {
		writeError(w, status, "invalid_request_error", msg)
	},
}

// responsesTextTypes are the content part types of Responses messages that
// carry text.
var responsesTextTypes = []string{"input_text", "output_text", "text"}

func decodeResponses(body []byte, req *Request) (parseOptions, error) {
	var wire struct {
		Model        string          `json:"model"`
		Instructions *string         `json:"instructions"`
		Input        json.RawMessage `json:"input"`
		Tools        []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"tools"`
		Stream bool `json:"stream"`
	}
	if err := decodeJSON(body, &wire, "a Responses"); err != nil {
		return parseOptions{}, err
	}
	req.Model, req.Stream = wire.Model, wire.Stream
	for _, t := range wire.Tools {
		req.Tools = append(req.Tools, cmp.Or(t.Name, t.Type))
	}
	if wire.Instructions != nil && *wire.Instructions != "" {
		req.Messages = append(req.Messages, textMessage("system", []string{*wire.Instructions}))
	}
	input, err := responsesInput(wire.Input)
	if err != nil {
		return parseOptions{}, err
	}
	req.Messages = append(req.Messages, input...)
	return parseOptions{}, nil
}

// responsesInput normalises a Responses input: a string is one user
// message; an array holds items: messages, function (and custom tool)
// calls, which join the assistant message before them, and their outputs,
// which become tool messages. Reasoning items are left out.
func responsesInput(raw json.RawMessage) ([]Message, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("the request has no input")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []Message{textMessage("user", []string{s})}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errors.New("input is neither a string nor an array of items")
	}
	var out []Message
	for i, rawItem := range items {
		var it struct {
			Type      string          `json:"type"`
			Role      string          `json:"role"`
			Content   json.RawMessage `json:"content"`
			CallID    string          `json:"call_id"`
			Name      string          `json:"name"`
			Arguments string          `json:"arguments"`
			Input     string          `json:"input"`
			Output    json.RawMessage `json:"output"`
		}
		if err := json.Unmarshal(rawItem, &it); err != nil {
			return nil, fmt.Errorf("input[%d]: %w", i, err)
		}
		switch {
		case it.Type == "message" || (it.Type == "" && it.Role != ""):
			if it.Role == "" {
				return nil, fmt.Errorf("input[%d]: a message with no role", i)
			}
			parts, err := textParts(it.Content, responsesTextTypes...)
			if err != nil {
				return nil, fmt.Errorf("input[%d].content: %w", i, err)
			}
			out = append(out, textMessage(it.Role, parts))
		case it.Type == "function_call" || it.Type == "custom_tool_call":
			if it.CallID == "" {
				return nil, fmt.Errorf("input[%d]: a %s with no call_id", i, it.Type)
			}
			call := ToolCall{ID: it.CallID, Name: it.Name, Arguments: cmp.Or(it.Arguments, it.Input)}
			if n := len(out); n > 0 && out[n-1].Role == "assistant" {
				out[n-1].ToolCalls = append(out[n-1].ToolCalls, call)
			} else {
				out = append(out, Message{Role: "assistant", ToolCalls: []ToolCall{call}})
			}
		case it.Type == "function_call_output" || it.Type == "custom_tool_call_output":
			if it.CallID == "" {
				return nil, fmt.Errorf("input[%d]: a %s with no call_id", i, it.Type)
			}
			parts, err := textParts(it.Output, responsesTextTypes...)
			if err != nil {
				return nil, fmt.Errorf("input[%d].output: %w", i, err)
			}
			m := textMessage("tool", parts)
			m.ToolCallID = it.CallID
			out = append(out, m)
		case it.Type == "reasoning":
		case it.Type == "":
			return nil, fmt.Errorf("input[%d]: an item with neither type nor role", i)
		default:
			out = append(out, Message{Role: it.Type, Content: string(rawItem)})
		}
	}
	return out, nil
}

func (c completion) responseID() string { return fmt.Sprintf("resp_fake%d", c.id) }
func (c completion) messageItemID() string {
	return fmt.Sprintf("msg_fake%d", c.id)
}
func (c completion) callItemID() string { return fmt.Sprintf("fc_fake%d", c.id) }

// hasText tells whether the reply has a text item: when it has text, or
// nothing else.
func (c completion) hasText() bool { return c.reply.Text != "" || c.reply.ToolCall == nil }

func (c completion) responseUsage() map[string]any {
	in, out := c.tokens()
	return map[string]any{
		"input_tokens": in, "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": out, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
		"total_tokens": in + out,
	}
}

// response is the response object: in progress with no output and no
// usage, or completed with both.
func (c completion) response(done bool) map[string]any {
	r := map[string]any{
		"id": c.responseID(), "object": "response", "created_at": c.created, "model": c.model,
		"status": "in_progress", "output": []any{}, "usage": nil, "error": nil, "incomplete_details": nil,
	}
	if done {
		r["status"], r["output"], r["usage"] = "completed", c.outputItems(), c.responseUsage()
	}
	return r
}

func (c completion) textItem(done bool) map[string]any {
	item := map[string]any{"type": "message", "id": c.messageItemID(), "role": "assistant", "status": "in_progress", "content": []any{}}
	if done {
		item["status"], item["content"] = "completed", []any{outputText(c.reply.Text)}
	}
	return item
}

func outputText(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
}

func (c completion) callItem(done bool) map[string]any {
	tc := c.reply.ToolCall
	item := map[string]any{"type": "function_call", "id": c.callItemID(), "call_id": tc.ID, "name": tc.Name, "status": "in_progress", "arguments": ""}
	if done {
		item["status"], item["arguments"] = "completed", c.arguments()
	}
	return item
}

// outputItems are the reply's output items, done: a message, then a
// function call.
func (c completion) outputItems() []any {
	var items []any
	if c.hasText() {
		items = append(items, c.textItem(true))
	}
	if c.reply.ToolCall != nil {
		items = append(items, c.callItem(true))
	}
	return items
}

// writeResponseJSON answers with one completed response object.
func (c completion) writeResponseJSON(w http.ResponseWriter) {
	writeJSONBody(w, http.StatusOK, c.response(true))
}

// writeResponseStream answers with the Responses API's events, each named
// by an event line and carrying its type and sequence number:
// response.created, response.in_progress; for text, output_item.added (a
// message), content_part.added, output_text.delta pieces,
// output_text.done, content_part.done, output_item.done; for a tool call,
// output_item.added (a function_call with empty arguments),
// function_call_arguments.delta pieces, function_call_arguments.done,
// output_item.done; then response.completed with the output and usage.
func (c completion) writeResponseStream(es *eventStream, _ parseOptions) error {
	seq := 0
	send := func(typ string, fields map[string]any) error {
		fields["type"] = typ
		fields["sequence_number"] = seq
		seq++
		return es.send(typ, fields)
	}
	if err := send("response.created", map[string]any{"response": c.response(false)}); err != nil {
		return err
	}
	if err := send("response.in_progress", map[string]any{"response": c.response(false)}); err != nil {
		return err
	}
	index := 0
	if c.hasText() {
		id := c.messageItemID()
		at := func(m map[string]any) map[string]any {
			m["item_id"], m["output_index"], m["content_index"] = id, index, 0
			return m
		}
		if err := send("response.output_item.added", map[string]any{"output_index": index, "item": c.textItem(false)}); err != nil {
			return err
		}
		if err := send("response.content_part.added", at(map[string]any{"part": outputText("")})); err != nil {
			return err
		}
		for _, piece := range pieces(c.reply.Text, 8) {
			if err := send("response.output_text.delta", at(map[string]any{"delta": piece})); err != nil {
				return err
			}
		}
		if err := send("response.output_text.done", at(map[string]any{"text": c.reply.Text})); err != nil {
			return err
		}
		if err := send("response.content_part.done", at(map[string]any{"part": outputText(c.reply.Text)})); err != nil {
			return err
		}
		if err := send("response.output_item.done", map[string]any{"output_index": index, "item": c.textItem(true)}); err != nil {
			return err
		}
		index++
	}
	if c.reply.ToolCall != nil {
		id := c.callItemID()
		if err := send("response.output_item.added", map[string]any{"output_index": index, "item": c.callItem(false)}); err != nil {
			return err
		}
		for _, piece := range pieces(c.arguments(), 16) {
			if err := send("response.function_call_arguments.delta", map[string]any{"item_id": id, "output_index": index, "delta": piece}); err != nil {
				return err
			}
		}
		if err := send("response.function_call_arguments.done", map[string]any{"item_id": id, "output_index": index, "arguments": c.arguments()}); err != nil {
			return err
		}
		if err := send("response.output_item.done", map[string]any{"output_index": index, "item": c.callItem(true)}); err != nil {
			return err
		}
	}
	return send("response.completed", map[string]any{"response": c.response(true)})
}
