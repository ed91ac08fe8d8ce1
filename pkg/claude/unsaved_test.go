package claude

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/harness"
)

// The unsaved-* testdata are real Claude Code 2.1.332 sessions and the
// stdout of the launch that wrote them (`--output-format stream-json
// --verbose`), made offline against the fake model, each launch SIGKILLed
// (with its tool) once the session held everything it printed, or run to
// its end; trimmed as the other fixtures (bookkeeping lines reduced to
// type, uuid, parentUuid and sessionId; lines without a uuid left out; the
// init event of stdout reduced to type, subtype, session_id and uuid):
//   - unsaved-fresh: a launch with the task, its reply a text block and a
//     Bash call (two lines, two stdout events), killed while the call ran;
//   - unsaved-resumed: unsaved-fresh continued (`--resume
//     --resume-session-at` with the interrupted result on stdin), its reply
//     again text and a Bash call, killed while that ran;
//     unsaved-resumed-before.jsonl is the session as it started;
//   - unsaved-done: a session of one Bash call killed mid-tool (task "run
//     the tool"), continued to its end: the stdin result, the call made
//     again, its result (and an attachment Claude Code saves after it),
//     the final answer and the run's result event; unsaved-done-before.jsonl
//     is the session as it started.
//
// Each cut of the whole session at a message line stands for a checkpoint
// that caught Claude Code before it had saved the rest.

// lines splits data into its lines, each with its newline.
func lines(data []byte) [][]byte {
	if len(data) == 0 {
		return nil
	}
	return bytes.SplitAfter(bytes.TrimRight(data, "\n"), []byte{'\n'})
}

// messageCuts are the lengths of data's first lines, for each message line
// at or after from bytes: the file cut just before it, and whole.
func messageCuts(data []byte, from int) []int {
	var cuts []int
	off := 0
	for _, l := range lines(data) {
		if off >= from && (bytes.Contains(l, []byte(`"type":"assistant"`)) || bytes.Contains(l, []byte(`"type":"user"`))) {
			cuts = append(cuts, off)
		}
		off += len(l)
	}
	return append(cuts, len(data))
}

// sessionLines are a session file's lines by uuid.
func sessionLines(t *testing.T, data []byte) map[string]unsavedLine {
	t.Helper()
	out := map[string]unsavedLine{}
	for _, l := range lines(data) {
		var s unsavedLine
		if err := json.Unmarshal(l, &s); err != nil {
			t.Fatalf("line %s: %v", l, err)
		}
		out[s.UUID] = s
	}
	return out
}

// sameContinuation fails unless a and b are continued the same way: the
// same entry, the same message sent.
func sameContinuation(t *testing.T, what string, a, b []byte) {
	t.Helper()
	sa, err := ParseSession(a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	sb, err := ParseSession(b)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	ca, erra := sa.Continuation()
	cb, errb := sb.Continuation()
	if erra != nil || errb != nil || ca.At != cb.At || string(ca.Input) != string(cb.Input) || ca.What != cb.What ||
		len(sa.Responses()) != len(sb.Responses()) || shape(sa) != shape(sb) {
		t.Errorf("%s: continued at %s with %s (%v, %d responses, %s); want at %s with %s (%v, %d responses, %s)", what,
			ca.At, ca.Input, erra, len(sa.Responses()), shape(sa), cb.At, cb.Input, errb, len(sb.Responses()), shape(sb))
	}
}

// checkRecovered checks what Unsaved added to the cut session against
// the whole one Claude Code wrote: the same lines (uuid, type, message
// content), each chained to the entry Claude Code chained it to, or,
// where that entry is one stdout does not show (an attachment), to the
// message before it; a line whose uuid Claude Code chose on its own (the
// continuation's input) is a new one, chained to rec.At, and the line
// after it to it.
func checkRecovered(t *testing.T, what string, cut, add, whole []byte, rec LaunchRecord) {
	t.Helper()
	all := sessionLines(t, whole)
	have := sessionLines(t, cut)
	s, err := ParseSession(whole)
	if err != nil {
		t.Fatal(err)
	}
	prev := ""
	for _, l := range lines(add) {
		var got unsavedLine
		if err := json.Unmarshal(l, &got); err != nil {
			t.Fatalf("%s: an added line %s: %v", what, l, err)
		}
		want, ok := all[got.UUID]
		switch {
		case !ok && got.Type == "user" && got.Parent == rec.At && prev == "":
			// the continuation's input, which Claude Code gave a uuid of its own
		case !ok:
			t.Errorf("%s: an added line Claude Code never wrote: %s", what, l)
		case got.Type != want.Type || !sameJSON(t, contentOf(t, got.Message), contentOf(t, want.Message)):
			t.Errorf("%s: added %s\nClaude Code wrote %s", what, l, mustJSON(t, want))
		case got.Parent != want.Parent && (have[want.Parent].UUID != "" || got.Parent != prev):
			t.Errorf("%s: line %s chained to %s, Claude Code chained it to %s", what, got.UUID, got.Parent, want.Parent)
		}
		if got.SessionID != s.ID || got.Sidechain {
			t.Errorf("%s: line %s of session %q (side chain %v), want %s", what, got.UUID, got.SessionID, got.Sidechain, s.ID)
		}
		have[got.UUID] = got
		prev = got.UUID
	}
}

func contentOf(t *testing.T, msg json.RawMessage) json.RawMessage {
	t.Helper()
	var m struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		t.Fatalf("message %s: %v", msg, err)
	}
	return m.Content
}

func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return string(mustJSON(t, x)) == string(mustJSON(t, y))
}

// TestUnsavedFresh: a launch that started the session, cut at each message
// line after the task: Unsaved adds, from its stdout, exactly the reply
// lines the cut left out, as Claude Code wrote them (the same uuids,
// content and parents: the first chained to the last attachment saved
// after the task), and the session is then continued as the whole one
// is; nothing is added to the whole one.
func TestUnsavedFresh(t *testing.T) {
	whole, stdout := readFixture(t, "unsaved-fresh.jsonl"), readFixture(t, "unsaved-fresh.stdout")
	rec := LaunchRecord{ID: "L1", Dir: "/sandbox/.ngharness/launches/L1"}
	for _, n := range messageCuts(whole, len(lines(whole)[0])+1) {
		cut := whole[:n]
		add, got, err := Unsaved(cut, rec, stdout)
		missing := bytes.Count(whole[n:], []byte(`"type":"assistant"`))
		if err != nil || got != missing {
			t.Fatalf("cut at %d: %d added (%v), want %d", n, got, err, missing)
		}
		checkRecovered(t, "fresh cut", cut, add, whole, rec)
		sameContinuation(t, "fresh cut", append(append([]byte(nil), cut...), add...), whole)
	}
}

// TestUnsavedResumed: a continued launch, cut from where it started: cut
// before the message it sent on stdin was saved, Unsaved adds that
// message (chained to the entry it resumed at, a uuid of its own) and the
// reply printed after it; cut later, the reply alone, chained as Claude
// Code chained it. Either way the session is then continued as the whole
// one is.
func TestUnsavedResumed(t *testing.T) {
	for _, name := range []string{"unsaved-resumed", "unsaved-done"} {
		before, whole, stdout := readFixture(t, name+"-before.jsonl"), readFixture(t, name+".jsonl"), readFixture(t, name+".stdout")
		if !bytes.HasPrefix(whole, before) {
			t.Fatalf("%s: the whole session does not start with the one before", name)
		}
		s, err := ParseSession(before)
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.Continuation()
		if err != nil {
			t.Fatal(err)
		}
		rec := LaunchRecord{ID: "L2", Dir: "/sandbox/.ngharness/launches/L2", Saved: int64(len(before)), At: c.At, Input: c.Input}
		for i, n := range messageCuts(whole, len(before)) {
			cut := whole[:n]
			add, got, err := Unsaved(cut, rec, stdout)
			missing := bytes.Count(whole[n:], []byte(`"type":"assistant"`)) + bytes.Count(whole[n:], []byte(`"type":"user"`))
			if err != nil || got != missing {
				t.Fatalf("%s cut %d at %d: %d added (%v), want %d:\n%s", name, i, n, got, err, missing, add)
			}
			checkRecovered(t, name, cut, add, whole, rec)
			sameContinuation(t, name, append(append([]byte(nil), cut...), add...), whole)
		}
	}
}

// TestUnsavedStopReason: a final answer printed before its stop reason
// came is added with the stop reason of the run's result event, so it
// counts as a completed response.
func TestUnsavedStopReason(t *testing.T) {
	before, whole, stdout := readFixture(t, "unsaved-done-before.jsonl"), readFixture(t, "unsaved-done.jsonl"), readFixture(t, "unsaved-done.stdout")
	s, _ := ParseSession(before)
	c, _ := s.Continuation()
	rec := LaunchRecord{ID: "L2", Dir: "/d", Saved: int64(len(before)), At: c.At, Input: c.Input}
	cuts := messageCuts(whole, len(before))
	cut := whole[:cuts[len(cuts)-2]] // all but the final answer
	add, n, err := Unsaved(cut, rec, stdout)
	if err != nil || n != 1 || !bytes.Contains(add, []byte(`"stop_reason":"end_turn"`)) || !bytes.Contains(add, []byte(`"text":"all done"`)) {
		t.Fatalf("%d added (%v): %s; want the final answer with stop_reason end_turn", n, err, add)
	}
}

// TestUnsavedNone: nothing is added, and no error, when nothing is
// missing, stdout is empty, or stdout is another session's or a
// subagent's.
func TestUnsavedNone(t *testing.T) {
	whole, stdout := readFixture(t, "unsaved-fresh.jsonl"), readFixture(t, "unsaved-fresh.stdout")
	cut := whole[:messageCuts(whole, 1)[0]]
	other := bytes.ReplaceAll(stdout, []byte(`"session_id":"`), []byte(`"session_id":"x`))
	sub := bytes.ReplaceAll(stdout, []byte(`"parent_tool_use_id":null`), []byte(`"parent_tool_use_id":"toolu_x"`))
	for what, c := range map[string]struct{ session, stdout []byte }{
		"all saved":       {whole, stdout},
		"no stdout":       {cut, nil},
		"another session": {cut, other},
		"a subagent's":    {cut, sub},
	} {
		if add, n, err := Unsaved(c.session, LaunchRecord{ID: "L1", Dir: "/d"}, c.stdout); err != nil || n != 0 || add != nil {
			t.Errorf("%s: %d added (%v): %s", what, n, err, add)
		}
	}
}

// TestUnsavedUnmatched: stdout that cannot be matched with the session is
// ErrUnmatched, saying why, and nothing is added: a session file whose
// last line is cut short, an entry saved after one that was not, a
// continuation whose entry is not in the file, no entry at all.
func TestUnsavedUnmatched(t *testing.T) {
	before, whole, stdout := readFixture(t, "unsaved-done-before.jsonl"), readFixture(t, "unsaved-done.jsonl"), readFixture(t, "unsaved-done.stdout")
	s, _ := ParseSession(before)
	c, _ := s.Continuation()
	rec := LaunchRecord{ID: "L2", Dir: "/d", Saved: int64(len(before)), At: c.At, Input: c.Input}
	var gap []byte // the whole session without the call made again
	for _, l := range lines(whole) {
		if !bytes.Contains(l, []byte(`"id":"toolu_fake10"`)) || !bytes.Contains(l, []byte(`"type":"assistant"`)) {
			gap = append(gap, l...)
		}
	}
	noAt := rec
	noAt.At = "6d6d6d6d-0000-4000-8000-000000000000"
	for _, c := range []struct {
		what    string
		session []byte
		rec     LaunchRecord
		want    string
	}{
		{"a cut last line", append(append([]byte(nil), before...), `{"type":"assi`...), rec, "the session file's last line is cut short"},
		{"a gap", gap, rec, "is saved but the earlier"},
		{"an entry not in the file", before, noAt, "the entry before the launch's first unsaved one"},
		{"no entry", []byte("\n"), rec, "the session file holds no entry"},
	} {
		add, n, err := Unsaved(c.session, c.rec, stdout)
		if !errors.Is(err, ErrUnmatched) || !strings.Contains(err.Error(), c.want) || n != 0 || add != nil {
			t.Errorf("%s: %d added (%v), want ErrUnmatched saying %q", c.what, n, err, c.want)
		}
	}
}

// TestRelaunchAddsUnsaved: through the adapter, a saved session without
// the reply its launch printed (the launch record and stdout in the
// launch folder, as the adapter and ngsup leave them) is continued at
// that reply: the resume decision says so and how many entries it adds;
// the launch appends them to the session file, sends the interrupted
// result of the reply's call, and records itself (its folder, the
// session's length, the entry and its input) for the next relaunch.
func TestRelaunchAddsUnsaved(t *testing.T) {
	a, sb, lent := newAdapter(t, Options{})
	st, _ := a.NewState("r1", 1, lent)
	s := stateOf(t, st)
	whole, stdout := readFixture(t, "unsaved-fresh.jsonl"), readFixture(t, "unsaved-fresh.stdout")
	cut := whole[:messageCuts(whole, 1)[0]]
	sess, _ := ParseSession(whole)
	file := filepath.Join(s.configDir(), "projects", "-work", sess.ID+".jsonl")
	launchDir := filepath.Join(sb.Root(), "launches", "L1")
	for p, data := range map[string][]byte{
		file:                                 cut,
		filepath.Join(s.Home, taskFileName):  []byte(fixtureTask),
		filepath.Join(launchDir, "stdout"):   stdout,
		filepath.Join(s.Home, "launch.json"): mustJSON(t, LaunchRecord{ID: "L1", Dir: launchDir}),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, err := a.ResumeDecision(context.Background(), lent, st, "r1", 2)
	if err != nil || !d.Resume || !strings.Contains(d.Reason, "holds 1 completed model response; continuing it") ||
		!strings.Contains(d.Reason, "first adding to it the 2 entries Claude Code had sent or received but not yet saved (from launch L1's stdout)") {
		t.Fatalf("decision %+v (%v); want continued, adding the 2 lines of the reply", d, err)
	}
	spec, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r1", Attempt: 2, LaunchID: "L2", LaunchDir: filepath.Join(sb.Root(), "launches", "L2"), Sandbox: lent, State: st, Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	saved, _ := os.ReadFile(file)
	sameContinuation(t, "the session after the launch", saved, whole)
	want, _ := sess.Continuation()
	if in, _ := os.ReadFile(spec.Stdin); string(in) != string(want.Input)+"\n" || !strings.Contains(strings.Join(spec.Argv, " "), "--resume-session-at "+want.At) {
		t.Errorf("argv %q input %s; want resumed at %s with %s", spec.Argv, in, want.At, want.Input)
	}
	var rec LaunchRecord
	if raw, err := os.ReadFile(filepath.Join(s.Home, "launch.json")); err != nil || json.Unmarshal(raw, &rec) != nil ||
		rec.ID != "L2" || rec.Dir != filepath.Join(sb.Root(), "launches", "L2") || rec.Saved != int64(len(saved)) || rec.At != want.At || string(rec.Input) != string(want.Input) {
		t.Errorf("the launch record %+v (%v); want L2, its folder, %d bytes saved, at %s", rec, err, len(saved), want.At)
	}
	// A second relaunch finds nothing more to add: the file is as it was.
	if d, err := a.ResumeDecision(context.Background(), lent, st, "r1", 3); err != nil || !d.Resume || strings.Contains(d.Reason, "adding") {
		t.Errorf("the next decision %+v (%v)", d, err)
	}
}

// TestFreshStartSaysRepliesLost: when no session file was written yet but
// the launch had printed a reply, the fresh start's reason says the
// model is asked again.
func TestFreshStartSaysRepliesLost(t *testing.T) {
	a, sb, lent := newAdapter(t, Options{})
	st, _ := a.NewState("r1", 1, lent)
	s := stateOf(t, st)
	launchDir := filepath.Join(sb.Root(), "launches", "L1")
	for p, data := range map[string][]byte{
		filepath.Join(s.configDir(), ".keep"): nil,
		filepath.Join(launchDir, "stdout"):    readFixture(t, "unsaved-fresh.stdout"),
		filepath.Join(s.Home, "launch.json"):  mustJSON(t, LaunchRecord{ID: "L1", Dir: launchDir}),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, err := a.ResumeDecision(context.Background(), lent, st, "r1", 2)
	if err != nil || d.Resume || !strings.Contains(d.Reason, "holds no session (launch L1 had printed 1 model reply before any was saved: the fresh start asks the model again)") {
		t.Errorf("decision %+v (%v)", d, err)
	}
}

// TestUnsavedToolResult: Claude Code prints a tool's result on stdout and
// sends it to the model before its session file holds it; when the
// launch was caught before the model's answer came, the result is added
// from stdout and the relaunch sends the saved result (the request that
// was in flight), not an interrupted one.
func TestUnsavedToolResult(t *testing.T) {
	before, whole, stdout := readFixture(t, "unsaved-done-before.jsonl"), readFixture(t, "unsaved-done.jsonl"), readFixture(t, "unsaved-done.stdout")
	s, _ := ParseSession(before)
	c, _ := s.Continuation()
	rec := LaunchRecord{ID: "L2", Dir: "/d", Saved: int64(len(before)), At: c.At, Input: c.Input}
	i := bytes.Index(stdout, []byte(`"type":"tool_result"`))
	printed := stdout[:i+bytes.IndexByte(stdout[i:], '\n')+1] // up to the result, the answer not come
	j := bytes.Index(whole, []byte(`"content":"again"`))
	cut := whole[:bytes.LastIndexByte(whole[:j], '\n')+1] // the session before the result
	add, n, err := Unsaved(cut, rec, printed)
	if err != nil || n != 1 {
		t.Fatalf("%d added (%v): %s; want the tool result", n, err, add)
	}
	got, err := ParseSession(append(append([]byte(nil), cut...), add...))
	if err != nil {
		t.Fatal(err)
	}
	cont, err := got.Continuation()
	if err != nil || cont.What != "the saved tool results whose answer never came" || !bytes.Contains(cont.Input, []byte(`"content":"again"`)) {
		t.Errorf("continued with %s (%s, %v); want the saved result sent again", cont.Input, cont.What, err)
	}
}
