package claude

// Claude Code saves its session lazily (measured on 2.1.332; the numbers
// are in docs/claude.md): each entry (a message it sends, a reply it
// gets, an attachment) is queued, and the queue is appended to the
// session file by a timer 100 ms after the first entry queued
// (FLUSH_INTERVAL_MS in its source), on a worker thread. A reply is
// printed on stdout (`--output-format stream-json --verbose`, one line a
// content block, the same uuid the session line gets) as soon as it is
// read, and its tool call starts at once, so a checkpoint can pause
// Claude Code with the reply printed and its tool running but nothing of
// it in the session file, and a relaunch from that snapshot would ask the
// model for the reply again. Before a relaunch reads the saved session,
// the adapter appends what the launch had sent or received but not saved:
// the entries of the launch's stdout (and the message its continuation
// sent on stdin) the file does not hold, in Claude Code's own line format,
// each chained to the one before it as Claude Code chains them.

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"path"

	"github.com/ngharness/ngharness/pkg/harness"
)

// launchRecordFile is, in the state folder, the record of the last launch
// on the state's session (LaunchRecord), written before it starts.
const launchRecordFile = "launch.json"

// maxStdout bounds what is read of a launch's stdout: its last 64 MiB.
// What the session lacks is the newest part of it.
const maxStdout = 64 << 20

// LaunchRecord is what the adapter keeps of a launch (launchRecordFile),
// to find what it had sent or received but not saved (Unsaved).
type LaunchRecord struct {
	// ID is the launch's id; Dir its folder, where ngsup writes Claude
	// Code's stdout (proto.StdoutFile).
	ID  string `json:"id"`
	Dir string `json:"dir"`
	// Saved is the session file's length in bytes when the launch
	// started (0 when it started a new session): the launch's own lines
	// come after it.
	Saved int64 `json:"saved"`
	// At is the chain entry a continuation resumed at (--resume-session-at),
	// and Input the stream-json line it sent on stdin (none for a launch
	// that started with the task, or a continuation that sent nothing).
	At    string          `json:"at,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

// stdoutPath is where the launch's stdout is, "" when the record names
// no absolute folder.
func (l LaunchRecord) stdoutPath() string {
	if !path.IsAbs(l.Dir) {
		return ""
	}
	return harness.LaunchStdout(path.Clean(l.Dir))
}

// entry is one message of a launch: a line of its stdout, or its input.
type entry struct {
	Type      string          `json:"type"`
	UUID      string          `json:"uuid"`
	SessionID string          `json:"session_id"`
	ParentTU  *string         `json:"parent_tool_use_id"`
	Message   json.RawMessage `json:"message"`
	Timestamp string          `json:"timestamp"`
	ToolUse   json.RawMessage `json:"tool_use_result"`
	// StopReason is a result event's.
	StopReason string `json:"stop_reason"`
	input      bool
}

// savedLine is what Unsaved reads of a session line.
type savedLine struct {
	Type       string `json:"type"`
	UUID       string `json:"uuid"`
	Parent     string `json:"parentUuid"`
	Sidechain  bool   `json:"isSidechain"`
	SessionID  string `json:"sessionId"`
	UserType   string `json:"userType"`
	Entrypoint string `json:"entrypoint"`
	CWD        string `json:"cwd"`
	Version    string `json:"version"`
	GitBranch  string `json:"gitBranch"`
	off        int64
}

// unsavedLine is a session line in Claude Code's format (its keys, in its
// order), made from a launch's entry.
type unsavedLine struct {
	Parent     string          `json:"parentUuid"`
	Sidechain  bool            `json:"isSidechain"`
	Type       string          `json:"type"`
	Message    json.RawMessage `json:"message"`
	UUID       string          `json:"uuid"`
	Timestamp  string          `json:"timestamp,omitempty"`
	ToolUse    json.RawMessage `json:"toolUseResult,omitempty"`
	UserType   string          `json:"userType,omitempty"`
	Entrypoint string          `json:"entrypoint,omitempty"`
	CWD        string          `json:"cwd,omitempty"`
	SessionID  string          `json:"sessionId"`
	Version    string          `json:"version,omitempty"`
	GitBranch  string          `json:"gitBranch,omitempty"`
}

// Unsaved are the session lines the launch l had sent or received but
// Claude Code had not saved in session (its file as saved) when the
// launch was paused or killed, and how many, read from stdout (what the
// launch printed; a cut last line is left out): the user and assistant
// messages of the main conversation (no subagent's) of the session's id
// that the file does not hold, and before them the message l sent on
// stdin if the file does not hold it either (a user line after l.At in
// the launch's part of the file) but a printed message followed it. They
// are the launch's last messages, since Claude Code saves its entries in
// the order it made them: the first is chained to the launch's entry
// before it (At, or for a launch that started the session the last
// entry the file holds after its first message), each other to the one
// before it. A reply printed before its stop reason came gets the stop
// reason the run's result printed after it. None is not an error; an
// error says why stdout and the file cannot be matched (then nothing is
// added).
func Unsaved(session []byte, l LaunchRecord, stdout []byte) ([]byte, int, error) {
	if len(bytes.TrimSpace(stdout)) == 0 {
		return nil, 0, nil
	}
	lines, err := savedLines(session)
	if err != nil {
		return nil, 0, err
	}
	if len(lines) == 0 {
		return nil, 0, fmt.Errorf("%w: the session file holds no entry", ErrUnmatched)
	}
	sid := ""
	have := map[string]bool{}
	var tmpl savedLine
	for _, s := range lines {
		if sid == "" {
			sid = s.SessionID
		}
		have[s.UUID] = true
		if s.Type == "user" || s.Type == "assistant" {
			tmpl = s
		}
	}
	printed := printedEntries(stdout, sid)
	if len(printed) == 0 {
		return nil, 0, nil
	}
	var ents []entry
	if l.At != "" && len(l.Input) > 0 {
		in, err := inputEntry(l.Input, lines, l)
		if err != nil {
			return nil, 0, err
		}
		ents = append(ents, in)
	}
	ents = append(ents, printed...)
	first := -1
	for i, e := range ents {
		switch {
		case !have[e.UUID] && first < 0:
			first = i
		case have[e.UUID] && first >= 0:
			return nil, 0, fmt.Errorf("%w: the launch's entry %s is saved but the earlier %s is not", ErrUnmatched, e.UUID, ents[first].UUID)
		}
	}
	if first < 0 {
		return nil, 0, nil
	}
	var at string
	switch {
	case ents[first].input:
		at = l.At
	case first > 0:
		at = lastDescendant(lines, ents[first-1].UUID)
	case l.At != "":
		at = lastDescendant(lines, l.At)
	default:
		at = lastDescendant(lines, rootOf(lines, l.Saved))
	}
	if at == "" || !have[at] {
		return nil, 0, fmt.Errorf("%w: the entry before the launch's first unsaved one (%q) is not in the session file", ErrUnmatched, at)
	}
	var out bytes.Buffer
	if len(session) > 0 && session[len(session)-1] != '\n' {
		out.WriteByte('\n')
	}
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	for i := first; i < len(ents); i++ {
		e := ents[i]
		if i > first {
			at = ents[i-1].UUID
		}
		ts := e.Timestamp
		if ts == "" && i+1 < len(ents) {
			ts = ents[i+1].Timestamp // sent just before it
		}
		line := unsavedLine{Parent: at, Type: e.Type, Message: e.Message, UUID: e.UUID, Timestamp: ts, ToolUse: e.ToolUse,
			UserType: tmpl.UserType, Entrypoint: tmpl.Entrypoint, CWD: tmpl.CWD, SessionID: sid, Version: tmpl.Version, GitBranch: tmpl.GitBranch}
		if err := enc.Encode(line); err != nil {
			return nil, 0, fmt.Errorf("%w: entry %s: %v", ErrUnmatched, e.UUID, err)
		}
	}
	return out.Bytes(), len(ents) - first, nil
}

// savedLines are the session file's lines that carry a uuid, of the main
// conversation, in order, each with its offset in the file. A last line
// cut short is an error: what Unsaved adds would follow it.
func savedLines(session []byte) ([]savedLine, error) {
	var out []savedLine
	off := int64(0)
	raw := bytes.SplitAfter(session, []byte{'\n'})
	for i, l := range raw {
		start := off
		off += int64(len(l))
		l = bytes.TrimSpace(l)
		if len(l) == 0 {
			continue
		}
		var s savedLine
		if err := json.Unmarshal(l, &s); err != nil {
			if i == len(raw)-1 {
				return nil, fmt.Errorf("%w: the session file's last line is cut short", ErrUnmatched)
			}
			return nil, fmt.Errorf("%w: the session file's line %d is not JSON", ErrUnmatched, i+1)
		}
		if s.UUID == "" || s.Sidechain {
			continue
		}
		s.off = start
		out = append(out, s)
	}
	return out, nil
}

// printedEntries are the user and assistant messages of the main
// conversation of session sid a launch printed on stdout, in order; a
// reply whose stop reason was not printed with it gets the one the
// result event after it printed.
func printedEntries(stdout []byte, sid string) []entry {
	var out []entry
	lastReply := -1
	for _, l := range bytes.Split(stdout, []byte{'\n'}) {
		var e entry
		if json.Unmarshal(bytes.TrimSpace(l), &e) != nil || e.SessionID != sid {
			continue
		}
		switch {
		case e.Type == "result" && lastReply >= 0 && e.StopReason != "":
			out[lastReply].Message = withStopReason(out[lastReply].Message, e.StopReason)
			lastReply = -1
		case (e.Type == "user" || e.Type == "assistant") && e.ParentTU == nil && e.UUID != "" && len(e.Message) > 0 && string(e.Message) != "null":
			e.StopReason = ""
			out = append(out, e)
			if e.Type == "assistant" {
				lastReply = len(out) - 1
			}
		}
	}
	return out
}

// withStopReason is an assistant message with stop_reason set to reason
// if it printed none (null, as Claude Code prints a reply before its
// stop reason comes).
func withStopReason(msg json.RawMessage, reason string) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(msg, &m) != nil {
		return msg
	}
	if r, ok := m["stop_reason"]; ok && string(r) != "null" {
		return msg
	}
	m["stop_reason"], _ = json.Marshal(reason)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(m) != nil {
		return msg
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}

// inputEntry is the message a continuation sent on stdin, as an entry:
// its saved line's uuid when the launch's part of the file holds it (a
// user line chained to At), else a new uuid.
func inputEntry(input json.RawMessage, lines []savedLine, l LaunchRecord) (entry, error) {
	var in struct {
		Type    string          `json:"type"`
		Message json.RawMessage `json:"message"`
	}
	if err := json.Unmarshal(input, &in); err != nil || in.Type != "user" || len(in.Message) == 0 {
		return entry{}, fmt.Errorf("%w: the launch's input is not a stream-json user message", ErrUnmatched)
	}
	for _, s := range lines {
		if s.off >= l.Saved && s.Type == "user" && s.Parent == l.At {
			return entry{Type: "user", UUID: s.UUID, Message: in.Message, input: true}, nil
		}
	}
	u, err := newUUID()
	if err != nil {
		return entry{}, err
	}
	return entry{Type: "user", UUID: u, Message: in.Message, input: true}, nil
}

// lastDescendant is the last line of the file (in file order) whose chain
// goes back to u, or u itself: the entry Claude Code chains the next one
// to (an attachment it saved after a message, say). A line's parent is
// always written before it.
func lastDescendant(lines []savedLine, u string) string {
	last := u
	desc := map[string]bool{u: true}
	for _, s := range lines {
		if desc[s.Parent] {
			desc[s.UUID] = true
			last = s.UUID
		}
	}
	return last
}

// rootOf is the first message line at or after offset from (the message
// a new session starts with), "" if none.
func rootOf(lines []savedLine, from int64) string {
	for _, s := range lines {
		if s.off >= from && (s.Type == "user" || s.Type == "assistant") {
			return s.UUID
		}
	}
	return ""
}

// newUUID is a random (version 4) UUID, as Claude Code's entries have.
func newUUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("cannot make a uuid: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// countReplies is how many assistant messages (one a message id) stdout
// printed for session sid, or for any session when sid is "".
func countReplies(stdout []byte, sid string) int {
	ids := map[string]bool{}
	for _, l := range bytes.Split(stdout, []byte{'\n'}) {
		if !bytes.HasPrefix(l, []byte(`{"type":"assistant"`)) {
			continue
		}
		var e struct {
			SessionID string  `json:"session_id"`
			ParentTU  *string `json:"parent_tool_use_id"`
			Message   struct {
				ID string `json:"id"`
			} `json:"message"`
		}
		if json.Unmarshal(l, &e) == nil && e.ParentTU == nil && (sid == "" || e.SessionID == sid) {
			ids[e.Message.ID] = true
		}
	}
	return len(ids)
}

// entriesNote says, for a launch record's reason, that n entries of
// launch l were added to its session.
func entriesNote(n int, l LaunchRecord) string {
	noun, from := "entries", "stdout"
	if n == 1 {
		noun = "entry"
	}
	if l.At != "" {
		from = "stdin and stdout"
	}
	return fmt.Sprintf("; first adding to it the %d %s Claude Code had sent or received but not yet saved (from launch %s's %s)", n, noun, l.ID, from)
}
