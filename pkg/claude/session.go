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

	"github.com/ngharness/ngharness/pkg/harness"
)

// Session is what the adapter reads of a saved session.
type Session struct {
	// ID is the session's uuid (sessionId), "" if no line names one.
	ID string
	// Messages are the user and assistant messages of the main chain, in
	// order, as Claude Code sends them to the model: an assistant message
	// written over several lines (one a content block, the same
	// message.id) is one message, also when tool results were written
	// between its lines; the tool results of one reply (a line each) are
	// one user message.
	Messages []Message
	// parent is every line's parentUuid, by uuid.
	parent map[string]string
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
	// Content is the content of a user message as saved (of a message of
	// several lines, the array of their blocks).
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

	raw  json.RawMessage // the block as saved
	line string          // the uuid of the line it is on
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
	no     int     // the line's number, from 1
	blocks []Block // the content's blocks, once read
	err    error   // why the content could not be read
}

// isMessage tells a line of the main conversation's messages.
func (l sessionLine) isMessage() bool {
	return (l.Type == "user" || l.Type == "assistant") && l.Message != nil && !l.Sidechain
}

// isResults tells a user line (or message) of tool results alone.
func isResults(role string, meta bool, blocks []Block) bool {
	if role != "user" || meta || len(blocks) == 0 {
		return false
	}
	for _, b := range blocks {
		if b.Type != "tool_result" {
			return false
		}
	}
	return true
}

// ParseSession reads a session file. A line that is not JSON is an error
// naming it, except a last line cut short (Claude Code killed while
// writing it). The messages are those of the chain that ends at the last
// message line, followed back by parentUuid as Claude Code does (lines a
// resume branched away from are left out), in file order, with the lines
// Claude Code recovers off that chain when it loads a session (measured on
// 2.1.332: the lines of a reply on the chain that are not on it, and the
// results of the reply's parallel calls, each written after its own call's
// line, so that only the last is on the chain; a result of a call the
// chain answers already is not one of them); side-chain lines (a
// subagent's) are left out.
func ParseSession(data []byte) (*Session, error) {
	s := &Session{parent: map[string]string{}}
	raw := bytes.Split(data, []byte{'\n'})
	last := len(raw) - 1
	for last >= 0 && len(bytes.TrimSpace(raw[last])) == 0 {
		last--
	}
	var lines []sessionLine
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
			s.parent[line.UUID] = line.Parent
		}
		if line.isMessage() {
			line.blocks, line.err = contentBlocks(line.Message.Content, line.UUID)
			lines = append(lines, line)
			leaf = line.UUID
		}
	}
	for _, line := range s.chain(lines, leaf) {
		if err := s.add(line); err != nil {
			return nil, err
		}
	}
	if s.ID == "" && len(s.Messages) == 0 {
		return nil, errors.New("no session id and no messages")
	}
	return s, nil
}

// chain are the message lines of the chain that ends at leaf, with the
// lines Claude Code recovers off it (ParseSession), in file order. When
// a parent is missing (a file cut or edited) the chain cannot be told,
// and every message line counts.
func (s *Session) chain(lines []sessionLine, leaf string) []sessionLine {
	in := map[string]bool{}
	for u := leaf; u != "" && !in[u]; {
		in[u] = true
		p, ok := s.parent[u]
		if !ok {
			return lines
		}
		u = p
	}
	if leaf == "" {
		return lines
	}
	// The lines of the chain's replies, and the calls the chain answers.
	replies := map[string]bool{}
	answered := map[string]bool{}
	for _, l := range lines {
		if in[l.UUID] && l.Type == "assistant" && l.Message.ID != "" {
			replies[l.Message.ID] = true
		}
		if in[l.UUID] {
			for _, b := range l.blocks {
				if b.Type == "tool_result" {
					answered[b.ToolUseID] = true
				}
			}
		}
	}
	replyLine := map[string]bool{}
	for _, l := range lines {
		if l.Type == "assistant" && replies[l.Message.ID] {
			in[l.UUID], replyLine[l.UUID] = true, true
		}
	}
	for _, l := range lines {
		if in[l.UUID] || !replyLine[l.Parent] || !isResults(l.Type, l.Meta, l.blocks) {
			continue
		}
		due := false
		for _, b := range l.blocks {
			due = due || !answered[b.ToolUseID]
		}
		if due {
			in[l.UUID] = true
			for _, b := range l.blocks {
				answered[b.ToolUseID] = true
			}
		}
	}
	var out []sessionLine
	for _, l := range lines {
		if in[l.UUID] {
			out = append(out, l)
		}
	}
	return out
}

// add adds a message line as Claude Code sends it: an assistant line of
// the reply before it (the same message.id, a content block a line) joins
// that reply, also across the tool results written between its lines; a
// line of tool results joins the tool results before it.
func (s *Session) add(line sessionLine) error {
	if line.err != nil {
		return fmt.Errorf("line %d: %s content: %v", line.no, line.Type, line.err)
	}
	m, blocks := line.Message, line.blocks
	n := len(s.Messages)
	var join *Message
	switch {
	case line.Type == "assistant" && m.ID != "" && n > 0 && s.Messages[n-1].Role == "assistant" && s.Messages[n-1].ID == m.ID:
		join = &s.Messages[n-1]
	case line.Type == "assistant" && m.ID != "" && n > 1 && s.Messages[n-1].isResults() && s.Messages[n-2].Role == "assistant" && s.Messages[n-2].ID == m.ID:
		join = &s.Messages[n-2]
	case isResults(line.Type, line.Meta, blocks) && n > 0 && s.Messages[n-1].isResults():
		join = &s.Messages[n-1]
	}
	if join != nil {
		join.Blocks = append(join.Blocks, blocks...)
		if m.StopReason != nil {
			join.StopReason = *m.StopReason
		}
		if line.Type == "assistant" {
			join.Usage = m.Usage
		} else {
			join.Content = join.savedBlocks()
		}
		join.UUID = line.UUID
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

// isResults tells a user message of tool results alone.
func (m Message) isResults() bool { return isResults(m.Role, m.Meta, m.Blocks) }

// savedBlocks is the message's blocks as saved, as one JSON array.
func (m Message) savedBlocks() json.RawMessage {
	raw := make([]json.RawMessage, len(m.Blocks))
	for i, b := range m.Blocks {
		raw[i] = b.raw
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(raw) // raw JSON values always encode
	return bytes.TrimRight(b.Bytes(), "\n")
}

// contentBlocks reads a message's content, on the line line: a string
// is one text block.
func contentBlocks(raw json.RawMessage, line string) ([]Block, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []Block{{Type: "text", Text: s, raw: raw, line: line}}, nil
	}
	var saved []json.RawMessage
	if err := json.Unmarshal(raw, &saved); err != nil {
		return nil, err
	}
	blocks := make([]Block, len(saved))
	for i, r := range saved {
		if err := json.Unmarshal(r, &blocks[i]); err != nil {
			return nil, err
		}
		blocks[i].raw, blocks[i].line = r, line
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
		if !b.isInterruptRecord() {
			return false
		}
	}
	return true
}

// isInterruptRecord tells a block of an interrupt's records: the note, or
// the rejection of the call it cut off.
func (b Block) isInterruptRecord() bool {
	return b.Type == "text" && strings.HasPrefix(b.Text, interruptedPrefix) ||
		b.Type == "tool_result" && b.IsError && strings.HasPrefix(b.ResultText(), rejectedPrefix)
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
	return harness.Continuable(s.ID, s.UserTurns(), len(s.Responses()), task)
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
//   - the model's last reply made tool calls (a crash while a tool ran,
//     or before the model answered their results): at the reply's last
//     line, send the results saved after it as saved, and for each call
//     the session holds no result for an error result, Claude Code's own
//     InterruptedText (what Claude Code sends for a call cut off by a
//     crash);
//   - a user message after the model's answer (a prompt whose answer
//     never came): at the message before it, send it again as saved;
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
	reply := -1
	for i, m := range main {
		if m.Role == "assistant" {
			reply = i
		}
	}
	leaf := main[len(main)-1]
	switch {
	case reply < 0:
		return Continuation{}, errors.New("the saved session has no model response before its last user message")
	case main[reply].UUID == "":
		return Continuation{}, errors.New("the saved session's last reply names no chain entry")
	case len(main[reply].ToolUses()) > 0 && s.onlyResultsAfter(main, reply):
		return s.answerCalls(main[reply], main[reply+1:])
	case leaf.Role == "assistant":
		return Continuation{At: leaf.UUID, What: "nothing: the session ended with the model's answer"}, nil
	}
	prev := main[len(main)-2]
	if prev.UUID == "" || len(bytes.TrimSpace(leaf.Content)) == 0 {
		return Continuation{}, errors.New("the saved session's last messages name no chain entry or no content")
	}
	in, err := userInput(leaf.Content)
	return Continuation{At: prev.UUID, Input: in, What: "the saved user message whose answer never came"}, err
}

// onlyResultsAfter tells that the messages after main[i] are tool results
// alone.
func (s *Session) onlyResultsAfter(main []Message, i int) bool {
	for _, m := range main[i+1:] {
		if !m.isResults() {
			return false
		}
	}
	return true
}

// answerCalls is the continuation at a reply with tool calls: the results
// saved after it (those not on its chain already, which the history
// holds), then an interrupted result for each call with none (a call
// whose result is the rejection a stop's SIGINT records has none).
func (s *Session) answerCalls(reply Message, after []Message) (Continuation, error) {
	history := map[string]bool{}
	for u := reply.UUID; u != "" && !history[u]; u = s.parent[u] {
		history[u] = true
	}
	answered := map[string]bool{}
	var results []any
	for _, m := range after {
		for _, b := range m.Blocks {
			if b.isInterruptRecord() {
				continue // the call a stop cut off: unanswered
			}
			if !history[b.line] {
				results = append(results, b.raw)
			}
			answered[b.ToolUseID] = true
		}
	}
	saved := len(results)
	for _, b := range reply.ToolUses() {
		if !answered[b.ID] {
			results = append(results, map[string]any{"type": "tool_result", "tool_use_id": b.ID, "content": InterruptedText, "is_error": true})
		}
	}
	cut := len(results) - saved
	var what string
	switch {
	case len(results) == 0:
		return Continuation{}, errors.New("the saved session's last reply has every tool call answered in its history, and no answer after it")
	case saved == 0:
		what = fmt.Sprintf("the interrupted tool call%s with Claude Code's interrupted result", harness.Plural(cut))
	case cut == 0:
		what = "the saved tool results whose answer never came"
	default:
		what = fmt.Sprintf("the saved tool result%s and, for the %d interrupted call%s, Claude Code's interrupted result", harness.Plural(saved), cut, harness.Plural(cut))
	}
	in, err := userInput(results)
	return Continuation{At: reply.UUID, Input: in, What: what}, err
}

// userInput is one stream-json input line: a user message with content,
// the saved parts of it byte for byte (no HTML escapes added).
func userInput(content any) (json.RawMessage, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(map[string]any{"type": "user", "message": map[string]any{"role": "user", "content": content}}); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}
