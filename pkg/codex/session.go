package codex

// Codex's saved session: $CODEX_HOME/sessions/YYYY/MM/DD/rollout-<ts>-<uuid>.jsonl,
// one {timestamp, type, payload} object a line. Measured on Codex 0.171.0:
// session_meta (payload.id is the session's uuid), turn_context,
// world_state, event_msg (task_started ... task_complete, token_count,
// item_completed), response_item (payload is exactly a Responses API input
// item: developer and user messages, function_call, function_call_output,
// assistant message, reasoning), and token_usage_record (one a completed
// model response: response_id and its usage). User messages Codex writes
// itself (the <environment_context> block) carry provenance "harness";
// the task's carries provenance "user".

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
	// ID is the session's uuid (session_meta), "" if none.
	ID string
	// Items are the response items, in order.
	Items []Item
	// Responses are the completed model responses (token_usage_record),
	// in order.
	Responses []ResponseUsage
}

// Item is one response_item: a Responses API input item.
type Item struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	CallID    string          `json:"call_id"`
	Output    json.RawMessage `json:"output"`
	Summary   []struct {
		Text string `json:"text"`
	} `json:"summary"`
	Meta *struct {
		Kinds    []string `json:"content_item_kinds"`
		Metadata []struct {
			Provenance struct {
				Type string `json:"type"`
			} `json:"provenance"`
		} `json:"content_item_metadata"`
	} `json:"internal_chat_message_metadata_passthrough"`
}

// ResponseUsage is one completed model response's token counts.
type ResponseUsage struct {
	ResponseID string `json:"response_id"`
	Usage      struct {
		InputTokens     int64 `json:"input_tokens"`
		CachedTokens    int64 `json:"cached_input_tokens"`
		OutputTokens    int64 `json:"output_tokens"`
		ReasoningTokens int64 `json:"reasoning_output_tokens"`
		TotalTokens     int64 `json:"total_tokens"`
	} `json:"usage"`
}

// ParseSession reads a session file. A line that is not JSON is an error
// naming it, except a last line cut short (Codex killed while writing it).
func ParseSession(data []byte) (*Session, error) {
	s := &Session{}
	lines := bytes.Split(data, []byte{'\n'})
	for i, l := range lines {
		l = bytes.TrimSpace(l)
		if len(l) == 0 {
			continue
		}
		var line struct {
			Type    string          `json:"type"`
			Payload json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(l, &line); err != nil {
			if i == len(lines)-1 || (i == len(lines)-2 && len(bytes.TrimSpace(lines[i+1])) == 0 && !bytes.HasSuffix(data, []byte{'\n'})) {
				break // a last line cut short
			}
			return nil, fmt.Errorf("line %d is not JSON: %v", i+1, err)
		}
		switch line.Type {
		case "session_meta":
			var m struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(line.Payload, &m) == nil && s.ID == "" {
				s.ID = m.ID
			}
		case "response_item":
			var it Item
			if err := json.Unmarshal(line.Payload, &it); err != nil {
				return nil, fmt.Errorf("line %d: response_item: %v", i+1, err)
			}
			s.Items = append(s.Items, it)
		case "token_usage_record":
			var u ResponseUsage
			if err := json.Unmarshal(line.Payload, &u); err != nil {
				return nil, fmt.Errorf("line %d: token_usage_record: %v", i+1, err)
			}
			s.Responses = append(s.Responses, u)
		}
	}
	if s.ID == "" && len(s.Items) == 0 {
		return nil, errors.New("no session_meta and no response items")
	}
	return s, nil
}

// Text is the text of a message's text parts (input_text, output_text),
// joined.
func (it Item) Text() string {
	var str string
	if json.Unmarshal(it.Content, &str) == nil {
		return str
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(it.Content, &parts)
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "input_text" || p.Type == "output_text" || p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// OutputText is a function_call_output's output: a string, or the text of
// its content items.
func (it Item) OutputText() string {
	var str string
	if json.Unmarshal(it.Output, &str) == nil {
		return str
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(it.Output, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	var obj struct {
		Content string `json:"content"`
	}
	_ = json.Unmarshal(it.Output, &obj)
	return obj.Content
}

// IsUserTurn tells a user message the user gave (the task, a later
// prompt) from one Codex writes itself (the environment context): by its
// provenance; a message without metadata counts unless it is an
// <environment_context> block.
func (it Item) IsUserTurn() bool {
	if it.Type != "message" || it.Role != "user" {
		return false
	}
	if it.Meta != nil && len(it.Meta.Metadata) > 0 {
		for _, m := range it.Meta.Metadata {
			if m.Provenance.Type != "user" {
				return false
			}
		}
		return true
	}
	if it.Meta != nil && len(it.Meta.Kinds) > 0 {
		for _, k := range it.Meta.Kinds {
			if k != "user.text" && !strings.HasPrefix(k, "user.") {
				return false
			}
		}
		return true
	}
	return !strings.HasPrefix(strings.TrimSpace(it.Text()), "<environment_context>")
}

// UserTurns are the texts of the session's user turns, in order.
func (s *Session) UserTurns() []string {
	var out []string
	for _, it := range s.Items {
		if it.IsUserTurn() {
			out = append(out, it.Text())
		}
	}
	return out
}

// Continuable applies the rule every adapter applies to a saved session:
// it starts with the task (if task is set) and holds at least one
// completed model response. why says which, as a launch record's reason.
func (s *Session) Continuable(task string) (bool, string) {
	return harness.Continuable(s.ID, s.UserTurns(), len(s.Responses), task)
}

// FinalText is the text of the session's last assistant message.
func (s *Session) FinalText() string {
	for i := len(s.Items) - 1; i >= 0; i-- {
		if it := s.Items[i]; it.Type == "message" && it.Role == "assistant" {
			return it.Text()
		}
	}
	return ""
}
