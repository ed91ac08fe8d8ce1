package gym

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// aggregate runs the request body through decode and compute, as the
// /aggregate_metrics handler will.
func aggregate(t *testing.T, body string) AggregateMetrics {
	t.Helper()
	req, err := DecodeAggregateMetricsRequest([]byte(body))
	if err != nil {
		t.Fatalf("DecodeAggregateMetricsRequest: %v", err)
	}
	got, err := ComputeAggregateMetrics(req.VerifyResponses)
	if err != nil {
		t.Fatalf("ComputeAggregateMetrics: %v", err)
	}
	return got
}

// sameJSON compares v's JSON with want's as numbers written, so 1 and 1.0
// differ (Gym writes a float statistic as 1.0).
func sameJSON(t *testing.T, what string, v any, want string) {
	t.Helper()
	got, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: marshal: %v", what, err)
	}
	decode := func(b []byte) any {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var x any
		if err := d.Decode(&x); err != nil {
			t.Fatalf("%s: %v in %s", what, err, b)
		}
		return x
	}
	if !reflect.DeepEqual(decode(got), decode([]byte(want))) {
		t.Fatalf("%s:\n got %s\nwant %s", what, got, want)
	}
}

const sample = `"sample": {"agent_ref": {"name": "agent"}}`

// Ports test_reward_profile.py::TestRewardProfile::test_profile_from_data
// through compute_aggregate_metrics (which profiles with a synthetic row,
// so each group's "sample" is {"agent_ref": {"name": "agent"}}). Booleans
// count as 0 and 1; Gym's expected max/bool True equals the 1 pandas
// gives for the integer column.
func TestAggregateMetricsProfileFromData(t *testing.T) {
	var rows []string
	for task := 0; task < 3; task++ {
		rows = append(rows,
			`{"_ng_task_index": `+strconv.Itoa(task)+`, "_ng_rollout_index": 0, "response": {"usage": {"abc usage": 1}}, "reward": 0, "bool": true}`,
			`{"_ng_task_index": `+strconv.Itoa(task)+`, "_ng_rollout_index": 1, "response": {"usage": {"abc usage": 1}}, "reward": 1, "bool": false}`)
	}
	got := aggregate(t, `{"verify_responses": [`+strings.Join(rows, ",")+`]}`)

	stats := func(std string) string {
		return `"mean/bool": 0.5, "mean/reward": 0.5, "mean/abc usage": 1.0,
			"max/bool": 1, "max/reward": 1, "max/abc usage": 1,
			"min/bool": 0, "min/reward": 0, "min/abc usage": 1,
			"median/bool": 0.5, "median/reward": 0.5, "median/abc usage": 1.0,
			"std/bool": ` + std + `, "std/reward": ` + std + `, "std/abc usage": 0.0`
	}
	var groups []string
	for task := 0; task < 3; task++ {
		groups = append(groups, `{`+stats("0.7071067811865476")+`, `+sample+`, "_ng_task_index": `+strconv.Itoa(task)+`}`)
	}
	sameJSON(t, "group_level_metrics", got.GroupLevelMetrics, `[`+strings.Join(groups, ",")+`]`)
	sameJSON(t, "agent_metrics", got.AgentMetrics, `{`+stats("0.5477225575051661")+`}`)
	sameJSON(t, "key_metrics", got.KeyMetrics, `{"mean/bool": 0.5, "mean/reward": 0.5, "mean/abc usage": 1.0}`)
}

// Ports test_reward_profile.py::TestRewardProfile::test_profile_from_data_mismatched_keys:
// a field only some rollouts hold is skipped where missing; a group of one
// rollout gets std 0 for the fields it holds (no field of it has two
// values); over all rollouts only "abc usage" has two values, so only it
// gets a std. The column with gaps is float (max/first_col 1.0); Gym's
// expected max/abc usage 1.0 equals the integer 1 pandas gives for the
// complete integer column.
func TestAggregateMetricsMismatchedKeys(t *testing.T) {
	got := aggregate(t, `{"verify_responses": [
		{"_ng_task_index": 0, "_ng_rollout_index": 0, "response": {"usage": {"abc usage": 1}}, "first_col": 1},
		{"_ng_task_index": 1, "_ng_rollout_index": 0, "response": {"usage": {"abc usage": 1}}, "second_col": 2}]}`)
	sameJSON(t, "group_level_metrics", got.GroupLevelMetrics, `[
		{"mean/first_col": 1.0, "mean/abc usage": 1.0, "max/first_col": 1.0, "max/abc usage": 1,
		 "min/first_col": 1.0, "min/abc usage": 1, "median/first_col": 1.0, "median/abc usage": 1.0,
		 "std/first_col": 0.0, "std/abc usage": 0.0, `+sample+`, "_ng_task_index": 0},
		{"mean/abc usage": 1.0, "mean/second_col": 2.0, "max/abc usage": 1, "max/second_col": 2.0,
		 "min/abc usage": 1, "min/second_col": 2.0, "median/abc usage": 1.0, "median/second_col": 2.0,
		 "std/abc usage": 0.0, "std/second_col": 0.0, `+sample+`, "_ng_task_index": 1}]`)
	sameJSON(t, "agent_metrics", got.AgentMetrics, `{
		"mean/first_col": 1.0, "mean/abc usage": 1.0, "mean/second_col": 2.0,
		"max/first_col": 1.0, "max/abc usage": 1, "max/second_col": 2.0,
		"min/first_col": 1.0, "min/abc usage": 1, "min/second_col": 2.0,
		"median/first_col": 1.0, "median/abc usage": 1.0, "median/second_col": 2.0,
		"std/abc usage": 0.0}`)
}

// Ports test_reward_profile.py::TestRewardProfile::test_profile_from_data_series
// (no reward at all, groups of unequal size: it must not fail).
func TestAggregateMetricsSeries(t *testing.T) {
	got := aggregate(t, `{"verify_responses": [
		{"_ng_task_index": 0, "_ng_rollout_index": 0, "response": {"usage": {"abc usage": 1}}},
		{"_ng_task_index": 0, "_ng_rollout_index": 1, "response": {"usage": {"abc usage": 1}}},
		{"_ng_task_index": 1, "_ng_rollout_index": 0, "response": {"usage": {"abc usage": 1}}}]}`)
	if len(got.GroupLevelMetrics) != 2 {
		t.Fatalf("got %d groups, want 2", len(got.GroupLevelMetrics))
	}
}

// Ports the group means of test_reward_profile.py::TestRewardProfile::
// test_rollout_infos_are_sorted_and_pass_rate_is_recoverable: usage fields
// join the rollout's own (mean/input_tokens 4.0), in whatever order the
// rollouts come.
func TestAggregateMetricsUsageFields(t *testing.T) {
	got := aggregate(t, `{"verify_responses": [
		{"_ng_task_index": 0, "_ng_rollout_index": 1, "response": {"usage": {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12}}, "reward": 1.0, "verifier_score": 3.5},
		{"_ng_task_index": 0, "_ng_rollout_index": 0, "response": {"usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}}, "reward": 0.0, "verifier_score": 1.5}]}`)
	g := got.GroupLevelMetrics[0]
	if g["mean/input_tokens"] != Float(4.0) || g["mean/verifier_score"] != Float(2.5) {
		t.Fatalf("group means = %v, %v; want 4.0, 2.5", g["mean/input_tokens"], g["mean/verifier_score"])
	}
	// reward is written 1.0 and 0.0: a float column, so max and min are floats.
	if g["max/reward"] != Float(1) || g["min/total_tokens"] != int64(7) {
		t.Fatalf("max/reward = %#v, min/total_tokens = %#v", g["max/reward"], g["min/total_tokens"])
	}
}

// Ports test_rollout_collection.py::TestRolloutCollection::test_run_from_config's
// expected _aggregate_metrics.json entry: what the collector sends (agent_ref
// stamped, response stripped to its usage) and the agent's reply.
func TestAggregateMetricsCollectorRows(t *testing.T) {
	var rows []string
	for task := 0; task < 3; task++ {
		for r := 0; r < 2; r++ {
			rows = append(rows, `{"_ng_task_index": `+strconv.Itoa(task)+`, "_ng_rollout_index": `+strconv.Itoa(r)+`, "response": {"usage": {"abc usage": 1}}, "agent_ref": {"name": "my agent name"}}`)
		}
	}
	got := aggregate(t, `{"verify_responses": [`+strings.Join(rows, ",")+`]}`)
	sameJSON(t, "agent_metrics", got.AgentMetrics, `{"mean/abc usage": 1.0, "max/abc usage": 1, "min/abc usage": 1, "median/abc usage": 1.0, "std/abc usage": 0.0}`)
	sameJSON(t, "key_metrics", got.KeyMetrics, `{"mean/abc usage": 1.0}`)
}

// compute_aggregate_metrics answers AggregateMetrics() for no rollouts,
// and so does an agent with skip_verification.
func TestAggregateMetricsEmpty(t *testing.T) {
	sameJSON(t, "empty", aggregate(t, `{"verify_responses": []}`), `{"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}`)
	sameJSON(t, "skip_verification", EmptyAggregateMetrics(), `{"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}`)
}

// Fields that are not numbers are left out, usage wins over a field of
// the same name, an empty usage adds nothing, tasks come out in ascending
// index whatever their order in, and the indexes themselves get no
// statistics.
func TestAggregateMetricsFields(t *testing.T) {
	got := aggregate(t, `{"verify_responses": [
		{"_ng_task_index": 10, "_ng_rollout_index": 0, "reward": 1, "note": "x", "extra": null, "list": [1], "total_tokens": 99, "response": {"usage": {"total_tokens": 3}}},
		{"_ng_task_index": 2, "_ng_rollout_index": 0, "reward": 0, "response": {"usage": {}}},
		{"_ng_task_index": 2, "_ng_rollout_index": 1, "reward": 0.5}]}`)
	if got.GroupLevelMetrics[0][FieldTaskIndex] != int64(2) || got.GroupLevelMetrics[1][FieldTaskIndex] != int64(10) {
		t.Fatalf("task order: %v, %v", got.GroupLevelMetrics[0][FieldTaskIndex], got.GroupLevelMetrics[1][FieldTaskIndex])
	}
	a := got.AgentMetrics
	if a["max/total_tokens"] != Float(3) {
		t.Fatalf("max/total_tokens = %#v, want usage's 3 (a float: the other rollouts lack it)", a["max/total_tokens"])
	}
	for k := range a {
		if strings.Contains(k, "note") || strings.Contains(k, "extra") || strings.Contains(k, "list") || strings.Contains(k, "_ng_") {
			t.Errorf("unexpected statistic %s", k)
		}
	}
	if a["median/reward"] != Float(0.5) || a["mean/reward"] != Float(0.5) {
		t.Fatalf("reward median, mean = %v, %v", a["median/reward"], a["mean/reward"])
	}
}

// Bad bodies are refused with a one-line detail naming what is wrong.
func TestAggregateMetricsRefusals(t *testing.T) {
	for body, want := range map[string]string{
		`[]`:                         "must be a JSON object",
		`{}`:                         "verify_responses is required",
		`{"verify_responses": {}}`:   "must be a list of objects",
		`{"verify_responses": [1]}`:  "verify_responses[0] must be an object",
		`{"verify_responses": [{}]}`: "verify_responses[0]: _ng_task_index must be an integer",
		`{"verify_responses": [{"_ng_task_index": true, "_ng_rollout_index": 0}]}`:                          "_ng_task_index must be an integer",
		`{"verify_responses": [{"_ng_task_index": 0}]}`:                                                     "_ng_rollout_index must be an integer",
		`{"verify_responses": [{"_ng_task_index": 0, "_ng_rollout_index": 0, "response": null}]}`:           "response must be an object",
		`{"verify_responses": [{"_ng_task_index": 0, "_ng_rollout_index": 0, "response": {"usage": [1]}}]}`: "response.usage must be an object",
		`{"verify_responses": [{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1e999}]}`:            "reward 1e999 is not a finite number",
		`{"verify_responses": []} {}`: "more than one JSON value",
	} {
		req, err := DecodeAggregateMetricsRequest([]byte(body))
		if err == nil {
			_, err = ComputeAggregateMetrics(req.VerifyResponses)
		}
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want an invalid request naming %q", body, err, want)
		}
	}
}

// Float writes what Python's json.dumps writes.
func TestFloatJSON(t *testing.T) {
	for v, want := range map[float64]string{
		1:                  "1.0",
		0:                  "0.0",
		0.5:                "0.5",
		-2.5:               "-2.5",
		0.7071067811865476: "0.7071067811865476",
		0.0001:             "0.0001",
		0.00001:            "1e-05",
		123456789012345:    "123456789012345.0",
		1234567890123456:   "1234567890123456.0",
		1e16:               "1e+16",
		1.5e300:            "1.5e+300",
		100:                "100.0",
	} {
		got, err := json.Marshal(Float(v))
		if err != nil || string(got) != want {
			t.Errorf("Float(%v) = %s, %v; want %s", v, got, err, want)
		}
	}
}

// NumPy sums float64 pairwise: ten 0.1s add up to 1.0 (a plain loop gives
// 0.9999999999999999).
func TestPairwiseSum(t *testing.T) {
	tenth := make([]float64, 10)
	plain := 0.0
	for i := range tenth {
		tenth[i] = 0.1
		plain += 0.1
	}
	if got := pairwiseSum(tenth); got != 1.0 || plain == 1.0 {
		t.Fatalf("pairwiseSum = %v (plain loop %v), want 1.0", got, plain)
	}
	many := make([]float64, 1000)
	for i := range many {
		many[i] = float64(i)
	}
	if got := pairwiseSum(many); got != 499500 {
		t.Fatalf("pairwiseSum(0..999) = %v", got)
	}
}
