package claude

// Claude Code's saved session:
// $CLAUDE_CONFIG_DIR/projects/<cwd, every '/' and '.' a '-'>/<uuid>.jsonl,
// one JSON object a line. Measured on Claude Code 2.1.332: lines of type
// "user" and "assistant" carry a message as the Messages API has it
// (message.role, message.content: a string or blocks), chained by uuid
// and parentUuid, with the session's id in sessionId; an assistant
// message's line also has message.id, message.model, message.stop_reason
// and message.usage. A user line whose blocks are tool_result blocks
// answers the tool_use blocks before it. Other line types (attachment,
// queue-operation, last-prompt, api-request, cost-state, ...) are Claude
// Code's own bookkeeping. An assistant message Claude Code writes itself
// (a resume's "No response requested.") has the model "<synthetic>";
// isMeta user lines are its own notes, not the user's.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Session is what the adapter reads of a saved session.
type Session struct {
	// ID is the session's uuid (sessionId), "" if no line names one.
	ID string
	// Messages are the user and assistant messages of the main chain, in
	// order; an assistant message written over several lines (one a
	// content block, the same message.id) is one message.
	Messages []Message
}

// Message is one message of the session.
type Message struct {
	// Role is user or assistant.
	Role string
	// ID is an assistant message's message.id.
	ID string
	// Model is an assistant message's model ("<synthetic>" when Claude
	// Code wrote it itself).
	Model string
	// StopReason is an assistant message's stop_reason, "" while it was
	// still streaming.
	StopReason string
	// Meta marks a user line Claude Code wrote as a note of its own.
	Meta bool
	// Blocks are the content blocks; a string content is one text block.
	Blocks []Block
	// Usage is an assistant message's token counts.
	Usage Usage
	// UUID is the chain entry of the message's last line (what
	// --resume-session-at names); Parent is the entry its first line
	// follows.
	UUID, Parent string
	// Content is the content of a user message as saved.
	Content json.RawMessage
}

// Block is one content block.
type Block struct {
	Type string `json:"type"`
	// Text is a text block's text; Thinking a thinking block's.
	Text     string `json:"text"`
	Thinking string `json:"thinking"`
	// ID, Name and Input are a tool_use block's.
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
	// ToolUseID, Content and IsError are a tool_result block's.
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// Usage is a model response's token counts, as the Messages API gives
// them.
type Usage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

// sessionLine is one line of a session file, as far as it is read.
type sessionLine struct {
	Type      string `json:"type"`
	SessionID string `json:"sessionId"`
	Sidechain bool   `json:"isSidechain"`
	Meta      bool   `json:"isMeta"`
	UUID      string `json:"uuid"`
	Parent    string `json:"parentUuid"`
	Message   *struct {
		Role       string          `json:"role"`
		ID         string          `json:"id"`
		Model      string          `json:"model"`
		StopReason *string         `json:"stop_reason"`
		Content    json.RawMessage `json:"content"`
		Usage      Usage           `json:"usage"`
	} `json:"message"`
	no int // the line's number, from 1
}

// isMessage tells a line of the main conversation's messages.
func (l sessionLine) isMessage() bool {
	return (l.Type == "user" || l.Type == "assistant") && l.Message != nil && !l.Sidechain
}

// ParseSession reads a session file. A line that is not JSON is an error
// naming it, except a last line cut short (Claude Code killed while
// writing it). The messages are those of the chain that ends at the last
// message line, followed back by parentUuid as Claude Code does (lines a
// resume branched away from are left out), in file order; side-chain lines
// (a subagent's) are left out.
func ParseSession(data []byte) (*Session, error) {
	s := &Session{}
	raw := bytes.Split(data, []byte{'\n'})
	last := len(raw) - 1
	for last >= 0 && len(bytes.TrimSpace(raw[last])) == 0 {
		last--
	}
	var lines []sessionLine
	parent := map[string]string{}
	leaf := ""
	for i, l := range raw {
		l = bytes.TrimSpace(l)
		if len(l) == 0 {
			continue
		}
		line := sessionLine{no: i + 1}
		if err := json.Unmarshal(l, &line); err != nil {
			if i == last && !bytes.HasSuffix(bytes.TrimRight(data, " \t\r"), []byte{'\n'}) {
				break // a last line cut short
			}
			return nil, fmt.Errorf("line %d is not JSON: %v", i+1, err)
		}
		if s.ID == "" {
			s.ID = line.SessionID
		}
		if line.UUID != "" {
			parent[line.UUID] = line.Parent
		}
		if line.isMessage() {
			lines = append(lines, line)
			leaf = line.UUID
		}
	}
	// The chain from the leaf back to its root; when a parent is missing
	// (a file cut or edited) the chain cannot be told, and every message
	// line counts.
	onChain := map[string]bool{}
	whole := leaf != ""
	for u := leaf; u != "" && !onChain[u]; {
		onChain[u] = true
		p, ok := parent[u]
		if !ok {
			whole = false
			break
		}
		u = p
	}
	for _, line := range lines {
		if whole && line.UUID != "" && !onChain[line.UUID] {
			continue
		}
		if err := s.add(line); err != nil {
			return nil, err
		}
	}
	if s.ID == "" && len(s.Messages) == 0 {
		return nil, errors.New("no session id and no messages")
	}
	return s, nil
}

// add adds a message line: an assistant line of the message before it
// (the same message.id, a content block a line) joins that message.
func (s *Session) add(line sessionLine) error {
	blocks, err := contentBlocks(line.Message.Content)
	if err != nil {
		return fmt.Errorf("line %d: %s content: %v", line.no, line.Type, err)
	}
	m := line.Message
	if n := len(s.Messages); line.Type == "assistant" && m.ID != "" && n > 0 && s.Messages[n-1].Role == "assistant" && s.Messages[n-1].ID == m.ID {
		prev := &s.Messages[n-1]
		prev.Blocks = append(prev.Blocks, blocks...)
		if m.StopReason != nil {
			prev.StopReason = *m.StopReason
		}
		prev.Usage = m.Usage
		prev.UUID = line.UUID
		return nil
	}
	msg := Message{Role: line.Type, ID: m.ID, Model: m.Model, Meta: line.Meta, Blocks: blocks, Usage: m.Usage,
		UUID: line.UUID, Parent: line.Parent}
	if line.Type == "user" {
		msg.Content = m.Content
	}
	if m.StopReason != nil {
		msg.StopReason = *m.StopReason
	}
	s.Messages = append(s.Messages, msg)
	return nil
}

// contentBlocks reads a message's content: a string is one text block.
func contentBlocks(raw json.RawMessage) ([]Block, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []Block{{Type: "text", Text: s}}, nil
	}
	var blocks []Block
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, err
	}
	return blocks, nil
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

// Claude Code's records of an interrupt (a SIGINT, as a stop sends): the
// running tool call gets a tool_result starting with rejectedPrefix (its
// line's toolUseResult "User rejected tool use"), and a user message with
// a text starting with interruptedPrefix follows ("[Request interrupted by
// user for tool use]", or "[Request interrupted by user]" between tool
// calls). Measured on 2.1.332. Neither is the user's: a continuation
// passes over them (Session.Continuation).
const (
	rejectedPrefix    = "The user doesn't want to proceed with this tool use."
	interruptedPrefix = "[Request interrupted by user"
)

// IsInterruptRecord tells a message Claude Code wrote when it was
// interrupted: the interrupt note, or tool results that are all the
// rejection of a call the interrupt cut off.
func (m Message) IsInterruptRecord() bool {
	if m.Role != "user" || len(m.Blocks) == 0 {
		return false
	}
	for _, b := range m.Blocks {
		switch {
		case b.Type == "text" && strings.HasPrefix(b.Text, interruptedPrefix):
		case b.Type == "tool_result" && b.IsError && strings.HasPrefix(b.ResultText(), rejectedPrefix):
		default:
			return false
		}
	}
	return true
}

// IsUserTurn tells a user message the user gave (the task, a later
// prompt) from tool results, Claude Code's own notes and its records of an
// interrupt.
func (m Message) IsUserTurn() bool {
	if m.Role != "user" || m.Meta || m.IsInterruptRecord() {
		return false
	}
	for _, bl := range m.Blocks {
		if bl.Type == "tool_result" {
			return false
		}
	}
	return true
}

// IsResponse tells a completed model response: an assistant message the
// model ended (a stop reason) or one whose tool call Claude Code ran, not
// one Claude Code wrote itself.
func (m Message) IsResponse() bool {
	return m.Role == "assistant" && m.Model != "<synthetic>" && (m.StopReason != "" || len(m.ToolUses()) > 0)
}

// ToolUses are the message's tool_use blocks.
func (m Message) ToolUses() []Block {
	var out []Block
	for _, b := range m.Blocks {
		if b.Type == "tool_use" {
			out = append(out, b)
		}
	}
	return out
}

// ResultText is a tool_result block's content: a string, or the text of
// its text blocks.
func (b Block) ResultText() string {
	var s string
	if json.Unmarshal(b.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(b.Content, &parts)
	var out strings.Builder
	for _, p := range parts {
		out.WriteString(p.Text)
	}
	return out.String()
}

// UserTurns are the texts of the session's user turns, in order.
func (s *Session) UserTurns() []string {
	var out []string
	for _, m := range s.Messages {
		if m.IsUserTurn() {
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

// Continuable applies the rule every adapter applies to a saved session:
// it starts with the task (if task is set) and holds at least one
// completed model response. why says which, as a launch record's reason.
func (s *Session) Continuable(task string) (bool, string) {
	users := s.UserTurns()
	n := len(s.Responses())
	switch {
	case len(users) == 0:
		return false, "the saved session has no user message"
	case task != "" && users[0] != task:
		return false, "the saved session does not start with the task"
	case n == 0:
		return false, "the saved session holds no completed model response"
	}
	suffix := "s"
	if n == 1 {
		suffix = ""
	}
	return true, fmt.Sprintf("session %s starts with the task and holds %d completed model response%s", s.ID, n, suffix)
}

// FinalText is the text of the session's last assistant message.
func (s *Session) FinalText() string {
	for i := len(s.Messages) - 1; i >= 0; i-- {
		if m := s.Messages[i]; m.Role == "assistant" && m.Model != "<synthetic>" {
			if t := m.Text(); t != "" {
				return t
			}
		}
	}
	return ""
}

// InterruptedText is Claude Code's own result text for a tool call cut off
// by a crash (2.1.332), which the continuation sends for a call the saved
// session holds no result for, as Claude Code itself would.
const InterruptedText = "[Tool call interrupted: the session ended before this call's result was recorded, so its outcome is unknown. Check whether it took effect before relying on it or running it again.]"

// Continuation is how a saved session is continued without a turn the
// task did not have: `claude -p --resume <ID> --resume-session-at <At>
// --input-format stream-json` with Input on stdin. Claude Code then sends
// the model the saved history up to and including At, then Input, and
// nothing else (measured on 2.1.332: a plain --resume adds a synthetic
// assistant "No response requested." and a new prompt).
type Continuation struct {
	// At is the chain entry the history ends with.
	At string
	// Input is the stream-json user message to send after it, nil for
	// none (the session had ended with the model's final answer).
	Input json.RawMessage
	// What says in words what is sent, for the launch record's reason.
	What string
}

// Continuation says how to continue the session from its leaf (its last
// message), or why it cannot:
//   - an assistant message whose tool calls hold no results (a crash
//     while a tool ran): at it, send an error result for each, Claude
//     Code's own InterruptedText;
//   - a user message (tool results, or a prompt, whose answer never came):
//     at the message before it, send that message again as saved;
//   - an assistant answer without tool calls (the run had ended): at it,
//     send nothing.
//
// Claude Code's synthetic messages and notes are passed over, and so are
// its records of an interrupt at the end (a stop's SIGINT): the call the
// interrupt cut off is then the leaf, continued as after a crash.
func (s *Session) Continuation() (Continuation, error) {
	var main []Message
	for _, m := range s.Messages {
		if !m.Meta && m.Model != "<synthetic>" {
			main = append(main, m)
		}
	}
	for len(main) > 0 && main[len(main)-1].IsInterruptRecord() {
		main = main[:len(main)-1]
	}
	if len(main) == 0 {
		return Continuation{}, errors.New("the saved session has no messages")
	}
	leaf := main[len(main)-1]
	switch {
	case leaf.Role == "assistant" && len(leaf.ToolUses()) > 0:
		if leaf.UUID == "" {
			return Continuation{}, errors.New("the saved session's last message names no chain entry")
		}
		var results []map[string]any
		for _, b := range leaf.ToolUses() {
			results = append(results, map[string]any{"type": "tool_result", "tool_use_id": b.ID, "content": InterruptedText, "is_error": true})
		}
		in, err := userInput(results)
		return Continuation{At: leaf.UUID, Input: in, What: fmt.Sprintf("the interrupted tool call%s with Claude Code's interrupted result", pluralS(len(results)))}, err
	case leaf.Role == "assistant":
		if leaf.UUID == "" {
			return Continuation{}, errors.New("the saved session's last message names no chain entry")
		}
		return Continuation{At: leaf.UUID, What: "nothing: the session ended with the model's answer"}, nil
	case len(main) < 2:
		return Continuation{}, errors.New("the saved session has no model response before its last user message")
	}
	prev := main[len(main)-2]
	if prev.UUID == "" || len(bytes.TrimSpace(leaf.Content)) == 0 {
		return Continuation{}, errors.New("the saved session's last messages name no chain entry or no content")
	}
	in, err := userInput(leaf.Content)
	what := "the saved user message whose answer never came"
	if !leaf.IsUserTurn() {
		what = "the saved tool results whose answer never came"
	}
	return Continuation{At: prev.UUID, Input: in, What: what}, err
}

// userInput is one stream-json input line: a user message with content.
func userInput(content any) (json.RawMessage, error) {
	return json.Marshal(map[string]any{"type": "user", "message": map[string]any{"role": "user", "content": content}})
}

func pluralS(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
