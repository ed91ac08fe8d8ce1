package opencode

import (
	"encoding/json"
	"strings"
	"testing"
)

// Sessions as `opencode export` (1.17.11) prints them, cut to the fields
// the decision reads.
const (
	userTurn = `{"info":{"id":"msg_1","role":"user","time":{"created":1}},"parts":[{"type":"text","text":"run the tool"}]}`
	// The main turn's reply is held: OpenCode has made the assistant
	// message, with no parts yet.
	heldReply = `{"info":{"id":"msg_2","role":"assistant","parentID":"msg_1","time":{"created":2}},"parts":[]}`
	// The model answered with a tool call and the tool still runs: no
	// finish and no time.completed until the tool returns.
	toolRunning = `{"info":{"id":"msg_2","role":"assistant","parentID":"msg_1","time":{"created":2}},"parts":[` +
		`{"type":"step-start"},{"type":"tool","tool":"bash","callID":"call_1","state":{"status":"running","input":{"command":"sleep 60"}}}]}`
	// The tool call's arguments were still streaming.
	toolPending = `{"info":{"id":"msg_2","role":"assistant","parentID":"msg_1","time":{"created":2}},"parts":[` +
		`{"type":"step-start"},{"type":"tool","tool":"bash","callID":"call_1","state":{"status":"pending"}}]}`
	stepDone = `{"info":{"id":"msg_2","role":"assistant","parentID":"msg_1","finish":"tool-calls","time":{"created":2,"completed":3}},"parts":[` +
		`{"type":"step-start"},{"type":"tool","tool":"bash","callID":"call_1","state":{"status":"completed"}},{"type":"step-finish","reason":"tool-calls"}]}`
)

func session(msgs ...string) *exported {
	var e exported
	if err := json.Unmarshal([]byte(`{"info":{"id":"ses_1"},"messages":[`+strings.Join(msgs, ",")+`]}`), &e); err != nil {
		panic(err)
	}
	return &e
}

// TestDecide: a saved session is continued when it starts with the task and
// the model has answered at least once, including a session saved while
// the tool the model called still ran (the state of a checkpoint taken
// mid-tool); one whose only reply was held, or cut while its tool call
// streamed, starts over.
func TestDecide(t *testing.T) {
	for _, c := range []struct {
		name   string
		e      *exported
		resume bool
		reason string
	}{
		{"mid-tool", session(userTurn, toolRunning), true, "holds 1 completed model response"},
		{"step done", session(userTurn, stepDone), true, "holds 1 completed model response"},
		{"held reply", session(userTurn, heldReply), false, "holds no completed model response"},
		{"tool call cut while streaming", session(userTurn, toolPending), false, "holds no completed model response"},
		{"no user message", session(toolRunning), false, "has no user message"},
		{"another task", session(strings.Replace(userTurn, "run the tool", "something else", 1), toolRunning), false, "does not start with the task"},
	} {
		d, err := decide(c.e, "run the tool")
		if err != nil || d.Resume != c.resume || !strings.Contains(d.Reason, c.reason) {
			t.Errorf("%s: resume %v, reason %q, error %v; want resume %v, a reason saying %q", c.name, d.Resume, d.Reason, err, c.resume, c.reason)
		}
	}
}
