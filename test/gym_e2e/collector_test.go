package gyme2e

// The collector: what Gym's rollout collection (nemo_gym/rollout_collection.py
// on main, 00536e7) posts to an agent's /run and reads back, and its
// /aggregate_metrics call at the end; with the checkpointing collection
// (nemo_gym/_checkpoint/collection.py) a restored row is posted again as
// its next attempt (_ng_attempt_index).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/harnesstest"

	"github.com/ngharness/ngharness/pkg/gym"
)

// job is what a row asks the fake harness and the lending owner to do.
type job struct {
	steps   int     // steps the harness takes
	stepS   float64 // seconds per step
	restart bool    // the owner answers the seed with x-ng-checkpoint-restart: 1
}

// row is one /run body as the collector sends it.
type row map[string]any

// clone is a shallow copy of r.
func (r row) clone() row {
	out := row{}
	for k, v := range r {
		out[k] = v
	}
	return out
}

// collector posts rows to one agent server.
type collector struct {
	url       string // the agent's base URL
	agentName string // its entry name: agent_ref.name
}

// row builds the body Gym's collector posts for task index task, repeat
// rollout: the dataset row (our task, the owner's check, the fake's
// options) with agent_ref, responses_create_params, _ng_task_index and
// _ng_rollout_index. The check passes only when the workdir's progress
// holds every step exactly once, in order.
func (c *collector) row(task, rollout int, j job) row {
	r := row{
		gym.FieldAgentRef:              map[string]any{"name": c.agentName},
		gym.FieldResponsesCreateParams: map[string]any{"input": []any{map[string]any{"role": "user", "content": fmt.Sprintf("count to %d", j.steps)}}},
		gym.FieldTaskIndex:             task,
		gym.FieldRolloutIndex:          rollout,
		"task":                         fmt.Sprintf("count to %d", j.steps),
		"check":                        fmt.Sprintf(`[ "$(cat progress)" = "$(seq -f 'step %%g' 1 %d)" ]`, j.steps),
		"fake":                         map[string]any{"steps": j.steps, "step_s": j.stepS},
	}
	if j.restart {
		r["restart"] = true
	}
	return r
}

// rolloutID is the rollout id Gym derives from a row
// (rollout_correlation.py): the explicit id, else "<task>-<rollout>".
func rolloutID(r row) string {
	if id, ok := r[gym.FieldRolloutID].(string); ok {
		return id
	}
	return fmt.Sprintf("%v-%v", r[gym.FieldTaskIndex], r[gym.FieldRolloutIndex])
}

// episode is the attempt a row posts: its rollout and _ng_attempt_index
// (an integer; the rows that send it as a string never ask for it here).
func episode(r row) gym.EpisodeID {
	id := gym.EpisodeID{RolloutID: rolloutID(r)}
	if a, ok := r[gym.FieldAttemptIndex].(int); ok {
		id.Attempt = a
	}
	return id
}

// nextAttempt is the row posted again as attempt+1, as the checkpointing
// collection sends a restored row.
func nextAttempt(r row) row {
	n := r.clone()
	n[gym.FieldAttemptIndex] = episode(r).Attempt + 1
	return n
}

// runResult is what a POST /run came back with.
type runResult struct {
	key    string // the capture key posted
	status int
	body   []byte
	err    error
}

func (r runResult) String() string {
	if r.err != nil {
		return fmt.Sprintf("/run %s: %v", r.key, r.err)
	}
	return fmt.Sprintf("/run %s: HTTP %d %s", r.key, r.status, e2eproc.Tail(string(bytes.TrimSpace(r.body)), 1500))
}

// post sends a row to /run and waits for the reply.
func (c *collector) post(ctx context.Context, r row) runResult {
	res := runResult{key: episode(r).CaptureKey()}
	data, err := json.Marshal(r)
	if err != nil {
		res.err = err
		return res
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/run", bytes.NewReader(data))
	if err != nil {
		res.err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		res.err = err
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	res.body, res.err = io.ReadAll(resp.Body)
	return res
}

// start posts a row in the background; the reply arrives on the channel.
func (c *collector) start(r row) <-chan runResult {
	ch := make(chan runResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		ch <- c.post(ctx, r)
	}()
	return ch
}

// await waits for a background run's reply.
func await(t *testing.T, ch <-chan runResult) runResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(waitLimit):
		t.Fatal("a /run did not reply in time")
		return runResult{}
	}
}

// rolloutReply is a /run reply as the collector and trainer read it.
type rolloutReply struct {
	Fields   map[string]json.RawMessage // the whole reply, as the collector keeps it
	Reward   float64
	Response map[string]json.RawMessage
	Launches []launch
}

// launch is one record of ng_harness_launches.
type launch struct {
	ID        string  `json:"id"`
	SandboxID string  `json:"sandbox_id"`
	Resumed   bool    `json:"resumed"`
	Reason    string  `json:"reason"`
	DurationS float64 `json:"duration_s"`
	Outcome   string  `json:"outcome"`
	ExitCode  int     `json:"exit_code"`
	Pauses    int     `json:"pauses"`
	Error     string  `json:"error"`
}

// reply reads a /run reply as Gym's collector does (raise_for_status, then
// a JSON object) and the fields training reads: a numeric reward, the
// response object, and our ng_harness_launches.
func (r runResult) reply(t *testing.T) rolloutReply {
	t.Helper()
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("%s", r)
	}
	f, err := checkShape("/run "+r.key+" reply", r.body, shape{"reward": wNumber, "response": wObject}, anyExtra)
	if err != nil {
		t.Fatal(err)
	}
	out := rolloutReply{Fields: f}
	json.Unmarshal(f["reward"], &out.Reward)
	json.Unmarshal(f["response"], &out.Response)
	raw, ok := f["ng_harness_launches"]
	if !ok || json.Unmarshal(raw, &out.Launches) != nil {
		t.Fatalf("%s: no ng_harness_launches list", r)
	}
	for _, name := range []string{gym.FieldNoPersist, gym.FieldFailureClass} {
		if v, ok := f[name]; ok && string(v) != "null" && string(v) != "false" {
			t.Errorf("%s: %s is %s: the collector would not file it as a success", r, name, v)
		}
	}
	// The response is what a trainer reads: a NeMoGymResponse of the
	// harness's session, its last assistant message the last step.
	if h := harnessOutput(t, out); h.Finished {
		harnesstest.CheckGymResponse(t, f["response"], "", fmt.Sprintf("step %d", h.Steps))
	}
	return out
}

// refusal checks a /run refused with code, in the envelope.
func (r runResult) refusal(t *testing.T, code string) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("%s", r)
	}
	checkRefusal(t, reply{who: "/run " + r.key, status: r.status, body: r.body}, code)
}

// fakeOutput is what the fake harness printed, from the fake_* fields
// beside the response.
type fakeOutput struct {
	Steps     int  `json:"fake_steps"`
	FirstStep int  `json:"fake_first_step"`
	Finished  bool `json:"fake_finished"`
}

// harnessOutput reads the fake harness's output from a reply's fields; a
// reply without them fails the test.
func harnessOutput(t *testing.T, rep rolloutReply) fakeOutput {
	t.Helper()
	var out fakeOutput
	data, _ := json.Marshal(rep.Fields)
	if _, ok := rep.Fields["fake_steps"]; !ok || json.Unmarshal(data, &out) != nil {
		t.Fatalf("the reply has no fake_* fields: %s", e2eproc.Tail(string(data), 2000))
	}
	return out
}

// aggregate posts /aggregate_metrics as the collector does at the end: every
// main-output reply stamped with the row's _ng_task_index,
// _ng_rollout_index and agent_ref, without response and
// responses_create_params (response's usage kept when not empty).
func (c *collector) aggregate(t *testing.T, rows []row, replies []rolloutReply) map[string]json.RawMessage {
	t.Helper()
	verify := []map[string]json.RawMessage{}
	for i, rep := range replies {
		v := map[string]json.RawMessage{}
		for k, raw := range rep.Fields {
			if k != "response" && k != gym.FieldResponsesCreateParams {
				v[k] = raw
			}
		}
		if u, ok := rep.Response["usage"]; ok && string(u) != "null" && string(u) != "{}" {
			v["response"], _ = json.Marshal(map[string]json.RawMessage{"usage": u})
		}
		for _, k := range []string{gym.FieldTaskIndex, gym.FieldRolloutIndex, gym.FieldAgentRef} {
			v[k], _ = json.Marshal(rows[i][k])
		}
		verify = append(verify, v)
	}
	data, _ := json.Marshal(map[string]any{"verify_responses": verify})
	resp, err := http.Post(c.url+"/aggregate_metrics", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatalf("POST /aggregate_metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /aggregate_metrics: HTTP %d %s", resp.StatusCode, body)
	}
	// group_level_metrics is a list of objects, the others objects.
	f, err := checkShape("/aggregate_metrics reply", body, shape{"agent_metrics": wObject, "key_metrics": wObject}, "group_level_metrics")
	if err != nil {
		t.Fatal(err)
	}
	var groups []map[string]json.RawMessage
	if json.Unmarshal(f["group_level_metrics"], &groups) != nil {
		t.Fatalf("/aggregate_metrics: group_level_metrics is not a list of objects: %s", f["group_level_metrics"])
	}
	return f
}

// meanReward is agent_metrics["mean/reward"] of an aggregate reply.
func meanReward(t *testing.T, f map[string]json.RawMessage) float64 {
	t.Helper()
	var m map[string]json.RawMessage
	json.Unmarshal(f["agent_metrics"], &m)
	var v float64
	if err := json.Unmarshal(m["mean/reward"], &v); err != nil {
		t.Fatalf("/aggregate_metrics: agent_metrics has no numeric mean/reward: %s", f["agent_metrics"])
	}
	return v
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
