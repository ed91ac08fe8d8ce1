package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The model APIs the server speaks, as Request.API names them.
const (
	// APIChat is OpenAI chat completions (POST /v1/chat/completions), the
	// wire of OpenCode and Pi.
	APIChat = "chat.completions"
	// APIResponses is the OpenAI Responses API (POST /v1/responses), the
	// wire of Codex CLI.
	APIResponses = "responses"
	// APIMessages is the Anthropic Messages API (POST /v1/messages), the
	// wire of Claude Code.
	APIMessages = "messages"
)

// Request is one model request as the server received it, whatever its
// API: the conversation it carried is normalised into Messages the same way
// for every API, so a test can compare histories across harnesses.
type Request struct {
	// API is the wire the request came in on: APIChat, APIResponses or
	// APIMessages.
	API string `json:"api"`
	// Path is the full URL path, including any /ng-rollout/<id>[-a<n>]
	// prefix (the query is not part of it).
	Path string `json:"path"`
	// Rollout is the whole path segment after /ng-rollout/ ("" without the
	// prefix), attempt suffix included: "r1-a2" for /ng-rollout/r1-a2/....
	Rollout string `json:"rollout,omitempty"`
	// Attempt is N when Rollout ends in -a<N>, else 0.
	Attempt int `json:"attempt,omitempty"`
	// Model is the model the request named.
	Model string `json:"model"`
	// Messages is the conversation the request carried, in order,
	// normalised (see Message): a system prompt given outside the messages
	// (Responses "instructions", Messages "system") comes first as a
	// "system" message; tool results are "tool" messages.
	Messages []Message `json:"messages"`
	// HasTools tells whether the request offered any tools.
	HasTools bool `json:"has_tools"`
	// Tools are the names of the tools offered, in order (a tool with no
	// name, such as a Responses built-in, is named by its type).
	Tools []string `json:"tools,omitempty"`
	// Stream tells whether the request asked for a streamed reply.
	Stream bool `json:"stream"`
	// Header is the request's HTTP header (e.g. Codex's
	// x-codex-turn-metadata, Claude Code's anthropic-beta).
	Header http.Header `json:"header,omitempty"`
	// Received is when the server read the request.
	Received time.Time `json:"received"`
	// Body is the raw request body.
	Body json.RawMessage `json:"body"`
}

// Message is one message of a request's conversation, in the same shape
// for every API.
type Message struct {
	// Role is system, developer, user, assistant or tool. A Responses input
	// item of a type the server does not know (other than "reasoning",
	// which is left out) is kept with its type as Role and its JSON as
	// Content, so that it still tells histories apart.
	Role string `json:"role"`
	// Content is the message's text: the text of its text parts joined by
	// newlines (other parts, such as images, are left out); null or no
	// content is "".
	Content string `json:"content"`
	// Parts are the text parts Content was joined from, each byte for byte
	// as sent (string content is one part).
	Parts []string `json:"parts,omitempty"`
	// ToolCallID is, for a tool message, the id of the call it answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// IsError is, for a tool message, whether the result was marked an
	// error (a Messages tool_result with is_error).
	IsError bool `json:"is_error,omitempty"`
	// ToolCalls are, for an assistant message, the tool calls it made.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is one function call, in a request's history or in a Reply.
type ToolCall struct {
	// ID is the call's id. In a Reply, "" gets a fresh id.
	ID string `json:"id"`
	// Name is the function's name, e.g. "bash".
	Name string `json:"name"`
	// Arguments is the call's arguments, a JSON object as text (in a Reply
	// on the Messages API it must be valid JSON: it is sent as the
	// tool_use block's input). In a Messages request's history it is the
	// tool_use block's input, compact.
	Arguments string `json:"arguments"`
}

// LastMessage is the request's last message, or the zero Message.
func (r Request) LastMessage() Message {
	if len(r.Messages) == 0 {
		return Message{}
	}
	return r.Messages[len(r.Messages)-1]
}

// HistoryKey is the request's normalised conversation (Messages: roles,
// texts, tool calls and results) as one string: two requests carried the
// same history exactly when their keys are equal, whatever else (ids of
// the request, cache hints, metadata) differed. Tests count model calls
// per distinct history with it.
func (r Request) HistoryKey() string {
	data, err := json.Marshal(r.Messages)
	if err != nil {
		panic(err) // strings, bools and slices of them always marshal
	}
	return string(data)
}

// SentMessages splits the request's body, as it came, into its
// conversation (each message, or each Responses input item, byte for
// byte) and the body with the conversation's array cut out: two requests
// that differ only by messages added at the end have equal rests and one
// list a prefix of the other, byte for byte. The conversation is "input"
// on the Responses API and "messages" on the others.
func (r Request) SentMessages() (msgs []json.RawMessage, rest []byte, err error) {
	key := "messages"
	if r.API == APIResponses {
		key = "input"
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(r.Body, &fields); err != nil {
		return nil, nil, fmt.Errorf("the body is not a JSON object: %w", err)
	}
	raw, ok := fields[key]
	if !ok {
		return nil, nil, fmt.Errorf("the body has no %q", key)
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, nil, fmt.Errorf("the body's %q is not an array: %w", key, err)
	}
	if n := bytes.Count(r.Body, raw); n != 1 {
		return nil, nil, fmt.Errorf("the body's %q array is found %d times in it", key, n)
	}
	return msgs, bytes.Replace(r.Body, raw, nil, 1), nil
}

// summary is one log line's worth of the request.
func (r Request) summary() string {
	last := r.LastMessage()
	return fmt.Sprintf("%s %s model=%s stream=%t tools=%d messages=%d last=%s %q",
		r.API, r.Path, r.Model, r.Stream, len(r.Tools), len(r.Messages), last.Role, clip(last.Content, 80))
}

// attemptSuffix splits "<id>-a<N>", as the rollout framework's prefix names
// an attempt.
var attemptSuffix = regexp.MustCompile(`^.+-a([0-9]+)$`)

// parseOptions are request fields that shape the reply but are not part of
// Request.
type parseOptions struct {
	includeUsage bool
}

// api is one wire protocol the server speaks: its route, how its request
// bodies become a Request, and how a Reply is written in it.
type api struct {
	// name is Request.API.
	name string
	// path is the route, below the optional /ng-rollout/{rollout} prefix.
	path string
	// callPrefix starts the ids of the tool calls the server makes up.
	callPrefix string
	// decode fills req's Model, Messages, Tools, HasTools and Stream from
	// body, or says what is wrong with it.
	decode func(body []byte, req *Request) (parseOptions, error)
	// writeJSON writes c as one JSON object.
	writeJSON func(c completion, w http.ResponseWriter)
	// writeStream writes c as server-sent events.
	writeStream func(c completion, es *eventStream, opts parseOptions) error
	// fail writes an error object of the API's shape.
	fail func(w http.ResponseWriter, status int, msg string)
}

// parseRequest reads r's body and parses it as a request of a.
func parseRequest(r *http.Request, a *api) (Request, parseOptions, error) {
	received := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return Request{}, parseOptions{}, fmt.Errorf("read body: %w", err)
	}
	if len(body) > maxBody {
		return Request{}, parseOptions{}, fmt.Errorf("body over %d bytes", maxBody)
	}
	req := Request{
		API:      a.name,
		Path:     r.URL.Path,
		Rollout:  r.PathValue("rollout"),
		Header:   r.Header.Clone(),
		Received: received,
		Body:     json.RawMessage(body),
	}
	if m := attemptSuffix.FindStringSubmatch(req.Rollout); m != nil {
		req.Attempt, _ = strconv.Atoi(m[1])
	}
	opts, err := a.decode(body, &req)
	if err != nil {
		return Request{}, parseOptions{}, err
	}
	req.HasTools = len(req.Tools) > 0
	return req, opts, nil
}

// textMessage is a message of role whose content is the text parts.
func textMessage(role string, parts []string) Message {
	return Message{Role: role, Content: strings.Join(parts, "\n"), Parts: parts}
}

// textParts turns content (absent, null, a string, or an array of parts)
// into its text parts: a string is one part; an array gives the text of
// each part whose type is one of textTypes (or that has no type but a
// text), skipping others such as images.
func textParts(raw json.RawMessage, textTypes ...string) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return []string{s}, err
	case '[':
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return nil, err
		}
		var texts []string
		for _, p := range parts {
			if (p.Type == "" && p.Text != "") || slices.Contains(textTypes, p.Type) {
				texts = append(texts, p.Text)
			}
		}
		return texts, nil
	}
	return nil, errors.New("neither a string nor an array of parts")
}

// decodeJSON unmarshals body into v, naming the API a body that is not
// one of its requests.
func decodeJSON(body []byte, v any, what string) error {
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("the body is not %s request: %w", what, err)
	}
	return nil
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "..."
}
