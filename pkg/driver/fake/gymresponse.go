package fake

// NeMo Gym's view of a fake rollout: the `response` of the /run reply, a
// NeMoGymResponse (gym.Response and its items) built from the fake
// harness's saved session (its steps), and the adapter's fake_* fields
// beside it, as the other adapters build theirs (pkg/claude, pkg/codex).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/harness"
)

// Model is the model a fake rollout's response names when the run body's
// responses_create_params names none: the fake harness is its own model.
const Model = "fake-harness"

// Session is the fake harness's saved session: its steps in order, each a
// model turn ("step 1", "step 2", ...).
type Session struct {
	Steps []string
}

// ParseSession reads a stored session: one JSON string a line, each a step
// (what Response keeps, read back by harness.ReadStoredRun).
func ParseSession(data []byte) (*Session, error) {
	s := &Session{Steps: []string{}}
	for _, line := range bytes.Split(data, []byte{'\n'}) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var step string
		if err := json.Unmarshal(line, &step); err != nil {
			return nil, fmt.Errorf("a step is not a JSON string: %w", err)
		}
		s.Steps = append(s.Steps, step)
	}
	return s, nil
}

// Output is the JSON line the fake harness prints when it ends.
type Output struct {
	Text      string `json:"text"`
	Steps     int    `json:"steps"`
	FirstStep int    `json:"first_step"`
	Task      string `json:"task"`
}

// GymRunFields are the fields the adapter adds beside `response` in the
// /run reply: what the harness printed and how it ended.
type GymRunFields struct {
	// Text, Steps, FirstStep and Task are the harness's last line: its
	// summary, how many steps the session holds, the step this launch
	// started at, and the task as the harness got it (zero when it printed
	// none).
	Text      string `json:"fake_text"`
	Steps     int    `json:"fake_steps"`
	FirstStep int    `json:"fake_first_step"`
	Task      string `json:"fake_task"`
	// Finished: the harness exited 0 and printed its line; Error says why
	// not otherwise.
	Finished bool   `json:"fake_finished"`
	Error    string `json:"fake_error,omitempty"`
	// SessionPath is the steps file inside the sandbox; SessionFound: it
	// was read.
	SessionPath  string `json:"fake_session_path"`
	SessionFound bool   `json:"fake_session_found"`
	// RunStderr is the tail of the harness's stderr.
	RunStderr string `json:"fake_run_stderr"`
}

// BuildGymResponse builds the NeMoGymResponse of a run from its session:
// each step is one model turn, an assistant output message whose text is
// the step. The task is the request's input, not output. The usage counts
// one token a word: each turn reads the task and writes its step. A nil
// session gives no output and a null usage.
func BuildGymResponse(s *Session, task string, opt gym.ResponseOptions) gym.Response {
	if opt.Model == "" {
		opt.Model = Model
	}
	r := gym.NewResponse(&opt)
	if s == nil {
		return r
	}
	var u gym.Usage
	for _, step := range s.Steps {
		r.Output = append(r.Output, &gym.OutputMessage{
			ID:      "msg_" + opt.NewHex(),
			Content: []gym.OutputText{{Annotations: []json.RawMessage{}, Text: step, Type: "output_text"}},
			Role:    "assistant", Status: "completed", Type: "message",
		})
		in, out := int64(len(strings.Fields(task))), int64(len(strings.Fields(step)))
		u.InputTokens += in
		u.OutputTokens += out
		u.TotalTokens += in + out
	}
	r.Usage = &u
	return r
}

// GymResult implements harness.GymResulter: `response` is the
// NeMoGymResponse of the saved session (BuildGymResponse, the task and the
// request side from the run body, the model Model unless the body's
// responses_create_params names one), and the fake_* fields go beside it.
func (a *Adapter) GymResult(response, body json.RawMessage) (json.RawMessage, map[string]json.RawMessage, error) {
	var t task
	_ = json.Unmarshal(body, &t) // a body without a task: the turns read nothing
	build := func(s *Session, opt gym.ResponseOptions) gym.Response { return BuildGymResponse(s, t.Task, opt) }
	return harness.LinesGymResult("fake", response, body, Model, ParseSession, build,
		func(r harness.StoredRun, found bool) any {
			f := GymRunFields{SessionPath: r.SessionPath, SessionFound: found, RunStderr: r.Stderr}
			var out Output
			line := lastLine(r.Stdout)
			switch {
			case r.ExitCode != 0:
				f.Error = fmt.Sprintf("the fake harness exited %d", r.ExitCode)
			case json.Unmarshal([]byte(line), &out) != nil:
				f.Error = "the fake harness printed no JSON line at its end"
			default:
				f.Finished = true
			}
			if json.Unmarshal([]byte(line), &out) == nil {
				f.Text, f.Steps, f.FirstStep, f.Task = out.Text, out.Steps, out.FirstStep, out.Task
			}
			return f
		})
}

// lastLine is the last line of s that is not blank.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

var _ harness.GymResulter = (*Adapter)(nil)
