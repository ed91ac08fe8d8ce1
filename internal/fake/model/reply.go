package model

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// Reply is what the server answers to one request, in the request's API:
// Text, ToolCall, or both (the text first). A reply with a tool call
// finishes as a tool call turn (chat "tool_calls", Messages "tool_use"),
// any other as a finished turn ("stop", "end_turn").
type Reply struct {
	// Text is a text answer.
	Text string
	// ToolCall is one tool call, e.g. Name "bash" with Arguments
	// `{"command": ..., "description": ...}`; Request.ShellCall makes the
	// shell call of the request's harness.
	ToolCall *ToolCall
	// Delay is how long to wait before answering (after any hold ends).
	Delay time.Duration
	// Pace, in a streamed reply, is the pause before each event after the
	// first: the headers and the first event go out at once, the rest
	// trickle, so a test can catch the harness mid-stream.
	Pace time.Duration
}

// DefaultTitle is the text DefaultScript answers a request with no tools
// (OpenCode's title request).
const DefaultTitle = "Fake session"

// DefaultFinal is the text DefaultScript answers once a tool has run.
const DefaultFinal = "done"

// DefaultScript is the script of one single-tool turn, decided from the
// request alone, for any API:
//   - a request with no tools (OpenCode's title request) gets the short text
//     DefaultTitle;
//   - a request whose last message has role "tool" (a tool result) gets the
//     final text DefaultFinal ("done");
//   - any other gets one shell tool call running cmd (Request.ShellCall).
//
// A completed OpenCode run against it makes 3 requests (title, tool call,
// final); Codex CLI and Claude Code runs make 2 (tool call, final).
func DefaultScript(cmd string) func(Request) Reply {
	return func(r Request) Reply {
		switch {
		case !r.HasTools:
			return Reply{Text: DefaultTitle}
		case r.LastMessage().Role == "tool":
			return Reply{Text: DefaultFinal}
		default:
			return Reply{ToolCall: r.ShellCall(cmd)}
		}
	}
}

// ShellCall is a call of the shell tool of the harness that speaks r's API,
// running cmd:
//   - chat completions (OpenCode, Pi): "bash" with {"command",
//     "description"} (Pi's bash takes {"command", "timeout"} and runs the
//     call all the same);
//   - Responses (Codex CLI): "exec_command" with {"cmd"};
//   - Messages (Claude Code): "Bash" with {"command", "description"}.
func (r Request) ShellCall(cmd string) *ToolCall {
	name, args := "bash", map[string]string{"command": cmd, "description": "Runs the scripted command"}
	switch r.API {
	case APIResponses:
		name, args = "exec_command", map[string]string{"cmd": cmd}
	case APIMessages:
		name = "Bash"
	}
	data, err := json.Marshal(args)
	if err != nil {
		panic(err) // a map of strings always marshals
	}
	return &ToolCall{Name: name, Arguments: string(data)}
}

func (r Reply) summary() string {
	var parts []string
	if r.Text != "" || r.ToolCall == nil {
		parts = append(parts, fmt.Sprintf("text %q", clip(r.Text, 80)))
	}
	if r.ToolCall != nil {
		parts = append(parts, fmt.Sprintf("tool call %s %s(%s)", r.ToolCall.ID, r.ToolCall.Name, clip(r.ToolCall.Arguments, 120)))
	}
	return strings.Join(parts, " + ")
}

// completion is one reply on its way out, in any API.
type completion struct {
	id           int64 // unique in the server: ids of the reply and its items derive from it
	model        string
	created      int64
	reply        Reply
	promptTokens int
}

// tokens is the reply's made-up usage: input and output tokens.
func (c completion) tokens() (in, out int) {
	out = 1 + len(c.reply.Text)/4
	if c.reply.ToolCall != nil {
		out += 1 + (len(c.reply.ToolCall.Name)+len(c.reply.ToolCall.Arguments))/4
	}
	return c.promptTokens, out
}

// arguments is the tool call's arguments; none is "{}".
func (c completion) arguments() string {
	if c.reply.ToolCall == nil || c.reply.ToolCall.Arguments == "" {
		return "{}"
	}
	return c.reply.ToolCall.Arguments
}

// eventStream writes server-sent events, flushing after each, at the
// reply's pace.
type eventStream struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	r    *http.Request
	s    *Server
	pace time.Duration
	sent int
}

// startEvents sends the headers of an event stream.
func (s *Server) startEvents(w http.ResponseWriter, r *http.Request, pace time.Duration) *eventStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	return &eventStream{w: w, rc: http.NewResponseController(w), r: r, s: s, pace: pace}
}

// send sends one event whose data is v as JSON, named event unless event
// is "".
func (es *eventStream) send(event string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return es.sendRaw(event, data)
}

// sendRaw sends one event whose data is data (one line), named event
// unless event is "". Past the first event it waits the pace first.
func (es *eventStream) sendRaw(event string, data []byte) error {
	if es.sent > 0 && es.pace > 0 {
		if err := es.s.wait(es.r, es.pace); err != nil {
			return fmt.Errorf("after %d events: %w", es.sent, err)
		}
	}
	var b strings.Builder
	if event != "" {
		b.WriteString("event: " + event + "\n")
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	if _, err := es.w.Write([]byte(b.String())); err != nil {
		return err
	}
	es.sent++
	return es.rc.Flush()
}

// pieces cuts s into pieces of about n bytes, never inside a UTF-8
// character.
func pieces(s string, n int) []string {
	var out []string
	for len(s) > 0 {
		cut := min(n, len(s))
		for cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut++
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return out
}

func writeJSONBody(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}
