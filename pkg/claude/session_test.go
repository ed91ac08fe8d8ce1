package claude

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// The testdata sessions are real Claude Code 2.1.332 session files, made
// offline against a scripted Messages API server with the task "say hi
// then run the tool" (every model reply streamed as the API does; each
// run in the folder its name says):
//   - finished.jsonl, whole as Claude Code wrote it (its bookkeeping lines
//     too: attachments, api-request copies, cost-state): one reply with a
//     thinking block, text and two parallel Bash calls (echo one, echo
//     two), each result on a line of its own whose parent is its call's
//     line (so the first result is off the leaf's parentUuid chain), then
//     "done";
//   - interleaved.jsonl: text and two Bash calls Claude Code blocked at
//     once, each result written between the reply's lines, then "done";
//   - midtool.jsonl: text and two Bash calls, SIGKILLed while the first
//     ran (the file ends with the reply's lines);
//   - partial.jsonl: two Bash calls, SIGKILLed while the second ran, after
//     the first's result was saved (it follows the first call's line, so
//     the second call's line is off the leaf's chain);
//   - noanswer.jsonl: one Bash call and its result, SIGKILLed while the
//     model's answer to it was held;
//   - sigint.jsonl: as partial.jsonl, but stopped by SIGINT (as a stop
//     sends) while the second call ran: Claude Code recorded the running
//     call's rejection and "[Request interrupted by user for tool use]";
//   - resumed.jsonl: noanswer.jsonl continued by
//     `claude -p --resume ID --resume-session-at <the call's line>
//     --input-format stream-json` with the saved result on stdin (the
//     model's request was the lost one byte for byte), then "done": the old
//     result line is off the new chain.
//
// All but finished.jsonl keep of the bookkeeping lines only type, uuid,
// parentUuid and sessionId (what Response stores, messageLines); the
// lines without a uuid are left out.
func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func parseFixture(t *testing.T, name string) *Session {
	t.Helper()
	s, err := ParseSession(readFixture(t, name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

// lineOf is the uuid of line n (from 1) of data.
func lineOf(t *testing.T, data []byte, n int) string {
	t.Helper()
	var l struct {
		UUID string `json:"uuid"`
	}
	lines := bytes.Split(data, []byte{'\n'})
	if n > len(lines) || json.Unmarshal(lines[n-1], &l) != nil || l.UUID == "" {
		t.Fatalf("line %d names no uuid", n)
	}
	return l.UUID
}

// lineWith is the uuid of the first line holding sub.
func lineWith(t *testing.T, data []byte, sub string) string {
	t.Helper()
	for i, l := range bytes.Split(data, []byte{'\n'}) {
		if bytes.Contains(l, []byte(sub)) {
			return lineOf(t, data, i+1)
		}
	}
	t.Fatalf("no line holds %q", sub)
	return ""
}

// shape is the session's messages as role:block types, | between.
func shape(s *Session) string {
	var parts []string
	for _, m := range s.Messages {
		var types []string
		for _, b := range m.Blocks {
			t := b.Type
			if b.ID != "" {
				t += "(" + b.ID + ")"
			}
			if b.ToolUseID != "" {
				t += "(" + b.ToolUseID + ")"
			}
			types = append(types, t)
		}
		parts = append(parts, m.Role+":"+strings.Join(types, ","))
	}
	return strings.Join(parts, " | ")
}

// TestParseSession: each real session reads as the messages the model
// was (or would have been) sent: the assistant lines of one message.id
// one message, also when tool results were written between them; the
// results of parallel calls one user message, also when a result or a
// call is off the leaf's parentUuid chain (Claude Code recovers them the
// same way); a resumed session's off-chain branch left out. One response
// is counted once.
func TestParseSession(t *testing.T) {
	for _, c := range []struct {
		file, shape string
		responses   int
	}{
		{"finished.jsonl", "user:text | assistant:thinking,text,tool_use(toolu_a1),tool_use(toolu_a2) | user:tool_result(toolu_a1),tool_result(toolu_a2) | assistant:text", 2},
		{"interleaved.jsonl", "user:text | assistant:text,tool_use(toolu_b1),tool_use(toolu_b2) | user:tool_result(toolu_b1),tool_result(toolu_b2) | assistant:text", 2},
		{"midtool.jsonl", "user:text | assistant:text,tool_use(toolu_m1),tool_use(toolu_m2)", 1},
		{"partial.jsonl", "user:text | assistant:tool_use(toolu_p1),tool_use(toolu_p2) | user:tool_result(toolu_p1)", 1},
		{"noanswer.jsonl", "user:text | assistant:tool_use(toolu_n1) | user:tool_result(toolu_n1)", 1},
		{"sigint.jsonl", "user:text | assistant:tool_use(toolu_p1),tool_use(toolu_p2) | user:tool_result(toolu_p1),tool_result(toolu_p2) | user:text", 1},
		{"resumed.jsonl", "user:text | assistant:tool_use(toolu_n1) | user:tool_result(toolu_n1) | assistant:text", 2},
	} {
		data := readFixture(t, c.file)
		s := parseFixture(t, c.file)
		if got := shape(s); got != c.shape {
			t.Errorf("%s:\n got %s\nwant %s", c.file, got, c.shape)
		}
		if n := len(s.Responses()); n != c.responses {
			t.Errorf("%s: %d responses, want %d", c.file, n, c.responses)
		}
		if !strings.Contains(string(data), `"sessionId":"`+s.ID+`"`) || len(s.ID) != 36 {
			t.Errorf("%s: session id %q", c.file, s.ID)
		}
		if got := s.UserTurns(); len(got) != 1 || got[0] != "say hi then run the tool" {
			t.Errorf("%s: user turns %q", c.file, got)
		}
	}
	// The merged message is the last line's chain entry, its usage and
	// stop reason; the final text is the last answer's.
	data := readFixture(t, "finished.jsonl")
	s := parseFixture(t, "finished.jsonl")
	m := s.Messages[1]
	if m.ID != "msg_gen1" || m.UUID != lineWith(t, data, `"id":"toolu_a2"`) || m.StopReason != "tool_use" || m.Usage.CacheReadInputTokens != 1000 {
		t.Errorf("the merged reply %+v", m)
	}
	if s.FinalText() != "done" {
		t.Errorf("final text %q", s.FinalText())
	}
	// The resumed session's result is the new line's, not the old one's.
	data = readFixture(t, "resumed.jsonl")
	s = parseFixture(t, "resumed.jsonl")
	if got, want := s.Messages[2].UUID, lineOf(t, data, 14); got != want {
		t.Errorf("the resumed result is line %s, want the new line %s", got, want)
	}
}

// TestParseSessionSideAndMeta: a side-chain line (a subagent's) is no
// message of the session, even as the file's last; an isMeta user line
// (Claude Code's own note) is a message marked Meta: no user turn, no
// Gym item, passed over by the continuation.
func TestParseSessionSideAndMeta(t *testing.T) {
	data := readFixture(t, "finished.jsonl")
	s := parseFixture(t, "finished.jsonl")
	final := s.Messages[len(s.Messages)-1].UUID
	extra := `{"type":"user","isMeta":true,"uuid":"meta-1","parentUuid":"` + final + `","sessionId":"` + s.ID + `","message":{"role":"user","content":"<local-command-caveat>note</local-command-caveat>"}}
{"type":"assistant","isSidechain":true,"uuid":"side-1","parentUuid":"meta-1","sessionId":"` + s.ID + `","message":{"role":"assistant","id":"msg_side","model":"policy","stop_reason":"end_turn","content":[{"type":"text","text":"from a subagent"}]}}
`
	s2, err := ParseSession(append(append([]byte{}, data...), extra...))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := shape(s2), shape(s)+" | user:text"; got != want {
		t.Fatalf("with a note and a side chain:\n got %s\nwant %s", got, want)
	}
	if m := s2.Messages[len(s2.Messages)-1]; !m.Meta || m.IsUserTurn() {
		t.Errorf("the note %+v", m)
	}
	if len(s2.UserTurns()) != 1 || s2.FinalText() != "done" {
		t.Errorf("user turns %q, final %q", s2.UserTurns(), s2.FinalText())
	}
	c, err := s2.Continuation()
	if err != nil || c.At != final || c.Input != nil {
		t.Errorf("continuation %+v %v, want at the final answer with no input", c, err)
	}
	for _, it := range BuildGymResponse(s2, testOptions()).Output {
		if b, _ := json.Marshal(it); bytes.Contains(b, []byte("note")) || bytes.Contains(b, []byte("subagent")) {
			t.Errorf("gym item %s", b)
		}
	}
}

// TestParseSessionCutShort: a last line cut short (Claude Code killed
// while writing it) is left out, on the whole file and on the slimmed
// one; a bad line in the middle is an error naming its line; a file
// with no session id and no message is an error.
func TestParseSessionCutShort(t *testing.T) {
	// cutAt is data's first n lines, the last of them cut in half.
	cutAt := func(data []byte, n int) []byte {
		lines := bytes.SplitAfter(data, []byte{'\n'})
		last := bytes.TrimRight(lines[n-1], "\n")
		return append(bytes.Join(lines[:n-1], nil), last[:len(last)/2]...)
	}
	data := readFixture(t, "finished.jsonl")
	n := bytes.Count(data, []byte{'\n'})
	s, err := ParseSession(cutAt(data, n))
	if err != nil || shape(s) != shape(parseFixture(t, "finished.jsonl")) {
		t.Errorf("finished, its last (bookkeeping) line cut short: %v", err)
	}
	data = readFixture(t, "noanswer.jsonl")
	s, err = ParseSession(cutAt(data, 12))
	if want := "user:text | assistant:tool_use(toolu_n1)"; err != nil || shape(s) != want {
		t.Errorf("no answer, its tool result line cut short: %v, got %s, want %s", err, shape(s), want)
	}
	bad := bytes.Replace(data, []byte("\n"), []byte("\n{\"type\":\"user\",\"uuid\n"), 1)
	if _, err := ParseSession(bad); err == nil || err.Error() != "line 2 is not JSON: unexpected end of JSON input" {
		t.Errorf("a bad second line: %v", err)
	}
	if _, err := ParseSession([]byte("{}\n\n")); err == nil {
		t.Error("an empty session parsed")
	}
}

// taskOnly is the first line of noanswer.jsonl: the task, no response.
func taskOnly(t *testing.T) *Session {
	t.Helper()
	data := readFixture(t, "noanswer.jsonl")
	s, err := ParseSession(data[:bytes.IndexByte(data, '\n')+1])
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestContinuable: the real sessions start with the task and hold their
// completed responses; another task, or a session with the task alone,
// is not continuable, each with its reason.
func TestContinuable(t *testing.T) {
	for _, c := range []struct {
		file string
		n    string
	}{{"finished.jsonl", "2 completed model responses"}, {"midtool.jsonl", "1 completed model response"}, {"noanswer.jsonl", "1 completed model response"}} {
		s := parseFixture(t, c.file)
		ok, why := s.Continuable("say hi then run the tool")
		if !ok || !strings.Contains(why, s.ID) || !strings.HasSuffix(why, c.n) {
			t.Errorf("%s: %v %q, want true naming %q", c.file, ok, why, c.n)
		}
		if ok, why := s.Continuable("another task"); ok || why != "the saved session does not start with the task" {
			t.Errorf("%s: another task: %v %q", c.file, ok, why)
		}
	}
	if ok, why := taskOnly(t).Continuable("say hi then run the tool"); ok || why != "the saved session holds no completed model response" {
		t.Errorf("the task alone: %v %q", ok, why)
	}
	if ok, why := (&Session{ID: "x"}).Continuable(""); ok || why != "the saved session has no user message" {
		t.Errorf("no message: %v %q", ok, why)
	}
}

// continuationInput decodes a continuation's stream-json line.
func continuationInput(t *testing.T, c Continuation) []json.RawMessage {
	t.Helper()
	var in struct {
		Type    string `json:"type"`
		Message struct {
			Role    string            `json:"role"`
			Content []json.RawMessage `json:"content"`
		} `json:"message"`
	}
	if err := json.Unmarshal(c.Input, &in); err != nil || in.Type != "user" || in.Message.Role != "user" {
		t.Fatalf("input %s: %v", c.Input, err)
	}
	return in.Message.Content
}

func interrupted(id string) string {
	b, _ := json.Marshal(map[string]any{"content": InterruptedText, "is_error": true, "tool_use_id": id, "type": "tool_result"})
	return string(b)
}

// TestContinuation: each leaf of a real session gives the continuation
// that makes Claude Code send the model the history it would have sent:
//   - killed mid-tool with two calls unanswered: at the reply's last
//     line, Claude Code's interrupted result for each call;
//   - killed after the first of two parallel calls' result was saved: at
//     the reply's last line (off the saved result's chain), the saved
//     result verbatim and the interrupted result of the other (what
//     `claude --resume-session-at` then sent was measured to be exactly
//     this);
//   - the tool result saved, no answer: at the call, the saved content
//     verbatim;
//   - the interleaved results of a reply, cut after the last result: at
//     the reply's last line, only the result not already before it, as
//     saved (no HTML escapes added);
//   - a finished session: at the final answer, no input;
//   - the task alone: an error.
func TestContinuation(t *testing.T) {
	data := readFixture(t, "midtool.jsonl")
	c, err := parseFixture(t, "midtool.jsonl").Continuation()
	if err != nil || c.At != lineOf(t, data, 13) {
		t.Fatalf("mid-tool: %+v %v", c, err)
	}
	if in := continuationInput(t, c); len(in) != 2 || string(in[0]) != interrupted("toolu_m1") || string(in[1]) != interrupted("toolu_m2") {
		t.Errorf("mid-tool input %s", c.Input)
	}
	if c.What != "the interrupted tool calls with Claude Code's interrupted result" {
		t.Errorf("mid-tool what %q", c.What)
	}

	data = readFixture(t, "partial.jsonl")
	c, err = parseFixture(t, "partial.jsonl").Continuation()
	if err != nil || c.At != lineOf(t, data, 12) {
		t.Fatalf("partial: %+v %v, want at line 12 %s", c, err, lineOf(t, data, 12))
	}
	saved := `{"tool_use_id":"toolu_p1","type":"tool_result","content":"one","is_error":false}`
	if in := continuationInput(t, c); len(in) != 2 || string(in[0]) != saved || string(in[1]) != interrupted("toolu_p2") {
		t.Errorf("partial input %s", c.Input)
	}
	if !strings.Contains(c.What, "saved tool result") || !strings.Contains(c.What, "interrupted") {
		t.Errorf("partial what %q", c.What)
	}

	// Stopped by SIGINT in the same place: the interrupt's records (the
	// running call's rejection, the note) are passed over, as after a
	// crash.
	data = readFixture(t, "sigint.jsonl")
	c, err = parseFixture(t, "sigint.jsonl").Continuation()
	if err != nil || c.At != lineWith(t, data, `"id":"toolu_p2"`) {
		t.Fatalf("sigint: %+v %v", c, err)
	}
	if in := continuationInput(t, c); len(in) != 2 || string(in[0]) != saved || string(in[1]) != interrupted("toolu_p2") {
		t.Errorf("sigint input %s", c.Input)
	}

	data = readFixture(t, "noanswer.jsonl")
	c, err = parseFixture(t, "noanswer.jsonl").Continuation()
	if err != nil || c.At != lineOf(t, data, 11) {
		t.Fatalf("no answer: %+v %v", c, err)
	}
	var line struct {
		Message struct {
			Content json.RawMessage `json:"content"`
		} `json:"message"`
	}
	_ = json.Unmarshal(bytes.Split(data, []byte{'\n'})[11], &line)
	want, _ := userInput(line.Message.Content)
	if !bytes.Equal(c.Input, want) || !bytes.Contains(c.Input, line.Message.Content) {
		t.Errorf("no answer input %s, want %s", c.Input, want)
	}
	if c.What != "the saved tool results whose answer never came" {
		t.Errorf("no answer what %q", c.What)
	}

	data = readFixture(t, "interleaved.jsonl")
	cut := data[:bytes.Index(data, []byte(lineOf(t, data, 15)))]
	cut = cut[:bytes.LastIndexByte(cut, '\n')+1]
	cut = append(cut, bytes.Split(data, []byte{'\n'})[14]...)
	s, err := ParseSession(append(cut, '\n'))
	if err != nil {
		t.Fatal(err)
	}
	c, err = s.Continuation()
	if err != nil || c.At != lineOf(t, data, 14) {
		t.Fatalf("interleaved: %+v %v", c, err)
	}
	if in := continuationInput(t, c); len(in) != 1 || !bytes.Contains(in[0], []byte(`"tool_use_id":"toolu_b2"`)) || !bytes.Contains(in[0], []byte("<tool_use_error>")) {
		t.Errorf("interleaved input %s, want the second result alone", c.Input)
	}

	data = readFixture(t, "finished.jsonl")
	c, err = parseFixture(t, "finished.jsonl").Continuation()
	if err != nil || c.At != lineWith(t, data, `"text":"done"`) || c.Input != nil {
		t.Errorf("finished: %+v %v", c, err)
	}
	if _, err := taskOnly(t).Continuation(); err == nil {
		t.Error("the task alone can be continued")
	}
}
