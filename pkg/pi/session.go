package pi

// Pi's saved session: <session dir>/<ISO time>_<uuid v7>.jsonl, one JSON
// object a line (measured on 0.73.1, docs/pi.md):
// a header {"type":"session","version":3,"id","timestamp","cwd"}, then
// entries with an 8-hex "id" and the "parentId" they attach to:
// model_change, thinking_level_change, and "message" entries whose
// message.role is user (content a string or text/image blocks),
// assistant (content blocks text, thinking and toolCall {id, name,
// arguments}; api, provider, model, usage, stopReason stop, toolUse,
// length, error or aborted, errorMessage, responseId) or toolResult
// (toolCallId, toolName, content blocks, isError); and entries Pi writes
// for its own features (compaction, branch_summary, custom,
// custom_message, label, session_info). The leaf, where the next entry
// attaches, is the file's last entry; the history the model gets is the
// chain from the leaf to the root. Pi writes nothing until the first
// assistant message ends, then each message at its end: a tool call
// before the tool runs, a tool result before the next request goes out.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ngharness/ngharness/pkg/harness"
)

// Session is what the adapter reads of a saved session.
type Session struct {
	// ID is the session's id (the header's), and Cwd the folder its tools
	// run in (Pi takes it from the header when it opens the file).
	ID, Cwd string
	// Leaf is the id of the file's last entry: where the next entry
	// attaches.
	Leaf string
	// Messages are the messages of the chain that ends at the leaf, in
	// order.
	Messages []Message
	// Other are the types of the chain's entries that are neither
	// messages nor model or thinking settings (a compaction, a branch
	// summary, an extension's message), in order.
	Other []string
	// Complete: the file ends with a whole line (a kill can cut the last
	// one short).
	Complete bool
}

// Message is one message entry of the session.
type Message struct {
	// Entry is the entry's id, Parent the entry it attaches to.
	Entry, Parent string
	// Role is user, assistant or toolResult (or a role of Pi's own
	// features, such as bashExecution).
	Role string
	// Blocks are the content blocks; a string content is one text block.
	Blocks []Block
	// StopReason is an assistant message's: stop, toolUse, length, error
	// or aborted.
	StopReason string
	// ErrorMessage says why an assistant message ended in error.
	ErrorMessage string
	// Provider and Model name an assistant message's model, ResponseID its
	// reply.
	Provider, Model, ResponseID string
	// Usage is an assistant message's token counts.
	Usage Usage
	// ToolCallID and ToolName are a tool result's call; IsError marks a
	// failed one.
	ToolCallID, ToolName string
	IsError              bool
}

// Block is one content block.
type Block struct {
	// Type is text, thinking, toolCall or image.
	Type string `json:"type"`
	// Text is a text block's text; Thinking a thinking block's.
	Text     string `json:"text"`
	Thinking string `json:"thinking"`
	// ID, Name and Arguments are a tool call's.
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Usage is an assistant message's token counts: Input excludes the cached
// tokens (CacheRead) and those written to the cache (CacheWrite).
type Usage struct {
	Input       int64 `json:"input"`
	Output      int64 `json:"output"`
	CacheRead   int64 `json:"cacheRead"`
	CacheWrite  int64 `json:"cacheWrite"`
	TotalTokens int64 `json:"totalTokens"`
}

// entry is one line of the file.
type entry struct {
	Type     string  `json:"type"`
	ID       string  `json:"id"`
	ParentID *string `json:"parentId"`
	Cwd      string  `json:"cwd"`
	Message  *struct {
		Role         string          `json:"role"`
		Content      json.RawMessage `json:"content"`
		StopReason   string          `json:"stopReason"`
		ErrorMessage string          `json:"errorMessage"`
		Provider     string          `json:"provider"`
		Model        string          `json:"model"`
		ResponseID   string          `json:"responseId"`
		Usage        Usage           `json:"usage"`
		ToolCallID   string          `json:"toolCallId"`
		ToolName     string          `json:"toolName"`
		IsError      bool            `json:"isError"`
	} `json:"message"`
}

// ParseSession reads a session file: its header, and the chain of entries
// from its last entry to the root. A last line cut short (a kill while Pi
// wrote it) is left out and the session marked incomplete; any other line
// that is not JSON, an entry without an id, or a parent the file does not
// hold is an error.
func ParseSession(data []byte) (*Session, error) {
	s := &Session{Complete: len(data) == 0 || data[len(data)-1] == '\n'}
	byID := map[string]entry{}
	lines := bytes.Split(data, []byte{'\n'})
	last := len(lines) - 1
	for last >= 0 && len(bytes.TrimSpace(lines[last])) == 0 {
		last--
	}
	header := false
	for i, l := range lines[:last+1] {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		var e entry
		if err := json.Unmarshal(l, &e); err != nil {
			if i == last && !s.Complete {
				break // a last line cut short
			}
			return nil, fmt.Errorf("line %d is not JSON: %v", i+1, err)
		}
		if e.Type == "session" {
			if header {
				return nil, fmt.Errorf("line %d is a second session header", i+1)
			}
			header, s.ID, s.Cwd = true, e.ID, e.Cwd
			continue
		}
		if !header {
			return nil, fmt.Errorf("line %d comes before the session header", i+1)
		}
		if e.ID == "" {
			return nil, fmt.Errorf("line %d: a %s entry without an id", i+1, e.Type)
		}
		byID[e.ID] = e
		s.Leaf = e.ID
	}
	if !header {
		return nil, errors.New("no session header")
	}
	var chain []entry
	seen := map[string]bool{}
	for id := s.Leaf; id != ""; {
		e, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("entry %s attaches to %s, which the file does not hold", chain[len(chain)-1].ID, id)
		}
		if seen[id] {
			return nil, fmt.Errorf("the chain of entry %s loops", id)
		}
		seen[id] = true
		chain = append(chain, e)
		if e.ParentID == nil {
			break
		}
		id = *e.ParentID
	}
	for i := len(chain) - 1; i >= 0; i-- {
		e := chain[i]
		switch {
		case e.Type == "message" && e.Message != nil:
			m, err := readMessage(e)
			if err != nil {
				return nil, err
			}
			s.Messages = append(s.Messages, m)
		case e.Type == "model_change" || e.Type == "thinking_level_change" || e.Type == "label" || e.Type == "session_info" || e.Type == "custom":
			// settings and notes: nothing the model gets
		default:
			s.Other = append(s.Other, e.Type)
		}
	}
	return s, nil
}

// readMessage reads a message entry.
func readMessage(e entry) (Message, error) {
	w := e.Message
	m := Message{Entry: e.ID, Role: w.Role, StopReason: w.StopReason, ErrorMessage: w.ErrorMessage,
		Provider: w.Provider, Model: w.Model, ResponseID: w.ResponseID, Usage: w.Usage,
		ToolCallID: w.ToolCallID, ToolName: w.ToolName, IsError: w.IsError}
	if e.ParentID != nil {
		m.Parent = *e.ParentID
	}
	content := bytes.TrimSpace(w.Content)
	switch {
	case len(content) == 0 || string(content) == "null":
	case content[0] == '"':
		var s string
		if err := json.Unmarshal(content, &s); err != nil {
			return m, fmt.Errorf("entry %s: %s content: %v", e.ID, w.Role, err)
		}
		m.Blocks = []Block{{Type: "text", Text: s}}
	default:
		if err := json.Unmarshal(content, &m.Blocks); err != nil {
			return m, fmt.Errorf("entry %s: %s content: %v", e.ID, w.Role, err)
		}
	}
	return m, nil
}

// Text is the text of the message's text blocks, joined.
func (m Message) Text() string {
	var b strings.Builder
	for _, bl := range m.Blocks {
		if bl.Type == "text" {
			b.WriteString(bl.Text)
		}
	}
	return b.String()
}

// ToolCalls are the message's toolCall blocks.
func (m Message) ToolCalls() []Block {
	var out []Block
	for _, b := range m.Blocks {
		if b.Type == "toolCall" {
			out = append(out, b)
		}
	}
	return out
}

// Failed tells an assistant message whose model call failed (stopReason
// error or aborted): Pi leaves it out of every request (pi-ai's
// transformMessages) and its own retry drops it before continuing.
func (m Message) Failed() bool {
	return m.Role == "assistant" && (m.StopReason == "error" || m.StopReason == "aborted")
}

// IsResponse tells a completed model response: an assistant message the
// model ended (stopReason stop, toolUse or length).
func (m Message) IsResponse() bool {
	return m.Role == "assistant" && (m.StopReason == "stop" || m.StopReason == "toolUse" || m.StopReason == "length")
}

// UserTurns are the texts of the session's user messages, in order.
func (s *Session) UserTurns() []string {
	var out []string
	for _, m := range s.Messages {
		if m.Role == "user" {
			out = append(out, m.Text())
		}
	}
	return out
}

// Responses are the session's completed model responses, in order.
func (s *Session) Responses() []Message {
	var out []Message
	for _, m := range s.Messages {
		if m.IsResponse() {
			out = append(out, m)
		}
	}
	return out
}

// Continuable applies the rule every adapter applies to a saved session
// (harness.Continuable): it starts with the task (if task is set) and
// holds at least one completed model response.
func (s *Session) Continuable(task string) (bool, string) {
	return harness.Continuable(s.ID, s.UserTurns(), len(s.Responses()), task)
}

// FinalText is the text of the session's last assistant message that has
// text.
func (s *Session) FinalText() string {
	for i := len(s.Messages) - 1; i >= 0; i-- {
		if m := s.Messages[i]; m.Role == "assistant" && !m.Failed() {
			if t := m.Text(); t != "" {
				return t
			}
		}
	}
	return ""
}

// NoResultText is Pi's own result text for a tool call that has no result
// (pi-ai's transformMessages sends it, with isError, for an orphaned
// call), which a continuation saves for each interrupted call.
const NoResultText = "No result provided"

// Call names one tool call.
type Call struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// Continuation is how the launcher continues a saved session without a
// turn the task did not have: it opens the file, which must end at At,
// saves an error result NoResultText for each call of Answer, drops the
// last Drop messages (failed replies) from what the agent holds, and runs
// Agent.continue(); when Ended, it sends nothing.
type Continuation struct {
	At     string `json:"at"`
	Answer []Call `json:"answer,omitempty"`
	Drop   int    `json:"drop,omitempty"`
	Ended  bool   `json:"ended,omitempty"`
	// What says in words what the model is sent, for the launch record's
	// reason.
	What string `json:"-"`
}

// Continuation says how to continue the session from its leaf, or why it
// cannot. Failed replies at the end (a model call that ended in error or
// was aborted) are dropped first, as Pi's own retry drops them, so the
// request whose answer never came goes out again. Then the chain's last
// message says what is due:
//   - a tool result: the results saved after the model's last reply, and
//     an error result NoResultText for each of its calls that has none
//     (Pi's own text for such a call);
//   - the model's reply with tool calls (a crash while a tool ran): an
//     error result for each call;
//   - a user message: it, as saved;
//   - the model's answer without tool calls (the run had ended): nothing.
//
// A file whose last line was cut short, or whose chain holds entries of
// Pi's own features (a compaction, a branch summary), is not continued.
func (s *Session) Continuation() (Continuation, error) {
	switch {
	case !s.Complete:
		return Continuation{}, errors.New("the session file's last line was cut short")
	case len(s.Other) > 0:
		return Continuation{}, fmt.Errorf("the session's chain holds %s entries, which the adapter does not continue", strings.Join(s.Other, ", "))
	case s.Leaf == "":
		return Continuation{}, errors.New("the session has no entries")
	}
	msgs := s.Messages
	drop := 0
	for len(msgs) > 0 && msgs[len(msgs)-1].Failed() {
		msgs = msgs[:len(msgs)-1]
		drop++
	}
	if len(msgs) == 0 {
		return Continuation{}, errors.New("the session has no message to continue from")
	}
	c := Continuation{At: s.Leaf, Drop: drop}
	reply := -1
	for i, m := range msgs {
		if m.Role == "assistant" && !m.Failed() {
			reply = i
		}
	}
	last := msgs[len(msgs)-1]
	switch last.Role {
	case "assistant", "toolResult":
		if reply < 0 {
			return Continuation{}, errors.New("the session has a tool result and no model reply before it")
		}
		answered := map[string]bool{}
		saved := 0
		for _, m := range msgs[reply+1:] {
			if m.Role != "toolResult" {
				return Continuation{}, fmt.Errorf("the session's last reply is followed by a %s message before its end", m.Role)
			}
			answered[m.ToolCallID] = true
			saved++
		}
		for _, b := range msgs[reply].ToolCalls() {
			if !answered[b.ID] {
				c.Answer = append(c.Answer, Call{ID: b.ID, Name: b.Name})
			}
		}
		switch {
		case last.Role == "assistant" && len(c.Answer) == 0:
			c.Ended = true
			c.What = "nothing: the session ended with the model's answer"
		case len(c.Answer) == 0:
			c.What = "the saved tool results whose answer never came"
		case saved == 0:
			c.What = fmt.Sprintf("the interrupted tool call%s with Pi's own error result %q", harness.Plural(len(c.Answer)), NoResultText)
		default:
			c.What = fmt.Sprintf("the saved tool result%s and, for the %d interrupted call%s, Pi's own error result %q",
				harness.Plural(saved), len(c.Answer), harness.Plural(len(c.Answer)), NoResultText)
		}
	case "user":
		c.What = "the saved user message whose answer never came"
	default:
		return Continuation{}, fmt.Errorf("the session ends with a %s message", last.Role)
	}
	if drop > 0 {
		if c.Ended || len(c.Answer) > 0 {
			return Continuation{}, fmt.Errorf("the session ends with %d failed repl%s after a message that was not sent", drop, plural(drop, "y", "ies"))
		}
		c.What += fmt.Sprintf(" (the %d failed repl%s after it left out, as Pi's own retry does)", drop, plural(drop, "y", "ies"))
	}
	return c, nil
}

// plural is one if n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
