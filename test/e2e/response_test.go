package e2e

import (
	"encoding/json"
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

// TestFakeReplyIsAGymResponse: the `response` of a fake rollout is a
// NeMoGymResponse a Gym trainer reads (harnesstest.CheckGymResponse: id,
// created_at, model, object "response", output, tools, tool_choice,
// parallel_tool_calls, usage; one assistant message a step of the
// harness's session, the last one the final answer; the usage counted),
// with what the harness printed in the fake_* fields beside it. So it is
// in the /run reply of `ngdriver serve` (which is the owner's /verify reply:
// the owner echoes the body it was sent, response included) and in the
// result `ngdriver run` prints, the demo's path.
func TestFakeReplyIsAGymResponse(t *testing.T) {
	e := newEnv(t, options{})
	id := e.rollout("gym")
	body := e.body(id, 3, 0.1)
	body["responses_create_params"] = map[string]any{"model": "policy", "input": "count to 3"}
	res := await(t, e.startRun("/run", id, body)).result(t)
	if res.Reward != 1 || !res.Fake.Finished || res.Fake.Steps != 3 || res.Fake.FirstStep != 1 || res.Fake.Text != "done after 3 steps" {
		t.Errorf("%s: reward %v, harness output %+v; want reward 1 and 3 steps from step 1", id, res.Reward, res.Fake)
	}
	harnesstest.CheckGymResponse(t, res.Response, "", "step 3")
	var model struct {
		Model string `json:"model"`
	}
	if json.Unmarshal(res.Response, &model); model.Model != "policy" {
		t.Errorf("the response names model %q, want the run body's policy", model.Model)
	}

	code, stdout, stderr := runCLI(t, nil, "run", "--steps", "3", "--step", "100ms", "--state-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("ngdriver run exited %d:\n%s", code, stderr)
	}
	var out struct {
		Reward   float64         `json:"reward"`
		Response json.RawMessage `json:"response"`
		Steps    int             `json:"fake_steps"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil || out.Reward != 1 || out.Steps != 3 {
		t.Fatalf("ngdriver run printed %q (%v), want reward 1 after 3 steps", stdout, err)
	}
	harnesstest.CheckGymResponse(t, out.Response, "", "step 3")
}
