package gym_test

import (
	"encoding/json"
	"fmt"

	"github.com/ngharness/ngharness/pkg/gym"
)

// A /run handler takes the episode from the body Gym's collector posted,
// and answers a body without one 400 rollout_id_required.
func ExampleRunIdentity() {
	for _, body := range []string{
		`{"_ng_task_index": 4, "_ng_rollout_index": 2, "responses_create_params": {"input": "solve"}}`,
		`{"_ng_rollout_id": "step7.task3", "_ng_attempt_index": 1}`,
		`{"responses_create_params": {"input": "solve"}}`,
	} {
		id, err := gym.RunIdentity([]byte(body))
		if err != nil {
			status, envelope := gym.Envelope(err)
			fmt.Println(status, envelope.Error.Code)
			continue
		}
		fmt.Println(id.CaptureKey(), id.RolloutID, id.Attempt)
	}
	// Output:
	// 4-2 4-2 0
	// step7.task3-a1 step7.task3 1
	// 400 rollout_id_required
}

// An /aggregate_metrics handler answers with the statistics of the verify
// responses the collector sent.
func ExampleComputeAggregateMetrics() {
	req, err := gym.DecodeAggregateMetricsRequest([]byte(`{"verify_responses": [
		{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0},
		{"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0}]}`))
	if err != nil {
		status, _ := gym.Envelope(err)
		fmt.Println(status)
		return
	}
	reply, err := gym.ComputeAggregateMetrics(req.VerifyResponses)
	if err != nil {
		status, _ := gym.Envelope(err)
		fmt.Println(status)
		return
	}
	key, _ := json.Marshal(reply.KeyMetrics)
	fmt.Println(string(key))
	// Output:
	// {"mean/reward":0.5}
}
