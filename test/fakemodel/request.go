package fakemodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Request is one chat-completions request as the server received it.
type Request struct {
	// Path is the full URL path, including any /ng-rollout/<id>[-a<n>]
	// prefix.
	Path string `json:"path"`
	// Rollout is the whole path segment after /ng-rollout/ ("" without the
	// prefix), attempt suffix included: "r1-a2" for /ng-rollout/r1-a2/....
	Rollout string `json:"rollout,omitempty"`
	// Attempt is N when Rollout ends in -a<N>, else 0.
	Attempt int `json:"attempt,omitempty"`
	// Model is the model the request named.
	Model string `json:"model"`
	// Messages is the conversation the request carried, in order.
	Messages []Message `json:"messages"`
	// HasTools tells whether the request offered any tools.
	HasTools bool `json:"has_tools"`
	// Stream tells whether the request asked for a streamed reply.
	Stream bool `json:"stream"`
	// Received is when the server read the request.
	Received time.Time `json:"received"`
	// Body is the raw request body.
	Body json.RawMessage `json:"body"`
}

// Message is one message of a request's conversation.
type Message struct {
	// Role is system, user, assistant or tool.
	Role string `json:"role"`
	// Content is the message's text; array content is flattened to the
	// text of its text parts, joined by newlines; null content is "".
	Content string `json:"content"`
	// ToolCallID is, for a tool message, the id of the call it answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// ToolCalls are, for an assistant message, the tool calls it made.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is one function call, in a request's history or in a Reply.
type ToolCall struct {
	// ID is the call's id. In a Reply, "" gets a fresh id.
	ID string `json:"id"`
	// Name is the function's name, e.g. "bash".
	Name string `json:"name"`
	// Arguments is the call's arguments, a JSON object as text.
	Arguments string `json:"arguments"`
}

// LastMessage is the request's last message, or the zero Message.
func (r Request) LastMessage() Message {
	if len(r.Messages) == 0 {
		return Message{}
	}
	return r.Messages[len(r.Messages)-1]
}

// summary is one log line's worth of the request.
func (r Request) summary() string {
	last := r.LastMessage()
	return fmt.Sprintf("%s model=%s stream=%t tools=%t messages=%d last=%s %q",
		r.Path, r.Model, r.Stream, r.HasTools, len(r.Messages), last.Role, clip(last.Content, 80))
}

// attemptSuffix splits "<id>-a<N>", as the rollout framework's prefix names
// an attempt.
var attemptSuffix = regexp.MustCompile(`^.+-a([0-9]+)$`)

// parseOptions are request fields that shape the reply but are not part of
// Request.
type parseOptions struct {
	includeUsage bool
}

func parseRequest(r *http.Request) (Request, parseOptions, error) {
	received := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return Request{}, parseOptions{}, fmt.Errorf("read body: %w", err)
	}
	if len(body) > maxBody {
		return Request{}, parseOptions{}, fmt.Errorf("body over %d bytes", maxBody)
	}
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
		Tools         []json.RawMessage `json:"tools"`
		Stream        bool              `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &wire); err != nil {
		return Request{}, parseOptions{}, fmt.Errorf("the body is not a chat-completions request: %w", err)
	}
	req := Request{
		Path:     r.URL.Path,
		Rollout:  r.PathValue("rollout"),
		Model:    wire.Model,
		HasTools: len(wire.Tools) > 0,
		Stream:   wire.Stream,
		Received: received,
		Body:     json.RawMessage(body),
	}
	if m := attemptSuffix.FindStringSubmatch(req.Rollout); m != nil {
		req.Attempt, _ = strconv.Atoi(m[1])
	}
	for i, wm := range wire.Messages {
		content, err := flattenContent(wm.Content)
		if err != nil {
			return Request{}, parseOptions{}, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		m := Message{Role: wm.Role, Content: content, ToolCallID: wm.ToolCallID}
		for _, tc := range wm.ToolCalls {
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		req.Messages = append(req.Messages, m)
	}
	opts := parseOptions{includeUsage: wire.StreamOptions != nil && wire.StreamOptions.IncludeUsage}
	return req, opts, nil
}

// flattenContent turns a message's content (absent, null, a string, or an
// array of parts) into text.
func flattenContent(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case '[':
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var texts []string
		for _, p := range parts {
			if p.Type == "text" || (p.Type == "" && p.Text != "") {
				texts = append(texts, p.Text)
			}
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", errors.New("neither a string nor an array of parts")
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "..."
}
