package gym

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// TestRunIdentity ports every case Gym's tests give
// maybe_rollout_id_from_run_body (and execution_identity_from_run_body,
// its checkpoint-branch twin that returns the episode rather than the
// key), each commented with the Gym test it comes from, then adds the
// cases where this package refuses what Gym's Python would format.
func TestRunIdentity(t *testing.T) {
	const (
		ok       = ""
		required = "required"
		invalid  = "invalid"
	)
	for _, tc := range []struct {
		name string
		body string
		want EpisodeID
		key  string // the capture key Gym's function returns
		err  string
	}{
		// test_base_responses_api_model.py::test_maybe_rollout_id_from_run_body_reads_canonical_indices
		{"canonical indices", `{"_ng_task_index": 3, "_ng_rollout_index": 1}`, EpisodeID{"3-1", 0}, "3-1", ok},
		{"partial: task only", `{"_ng_task_index": 3}`, EpisodeID{}, "", required},
		{"empty body", `{}`, EpisodeID{}, "", required},
		{"None body", `null`, EpisodeID{}, "", required},
		{"run-request model with extra fields", `{"_ng_task_index": 5, "_ng_rollout_index": 2, "responses_create_params": {"input": "x"}}`, EpisodeID{"5-2", 0}, "5-2", ok},

		// test_base_responses_api_model.py::test_maybe_rollout_id_from_run_body_attempt_suffix
		{"no attempt: bare key", `{"_ng_task_index": 3, "_ng_rollout_index": 2}`, EpisodeID{"3-2", 0}, "3-2", ok},
		{"first attempt: bare key", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_attempt_index": 0}`, EpisodeID{"3-2", 0}, "3-2", ok},
		{"attempt 1", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_attempt_index": 1}`, EpisodeID{"3-2", 1}, "3-2-a1", ok},
		{"attempt string coerced", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_attempt_index": "2"}`, EpisodeID{"3-2", 2}, "3-2-a2", ok},
		{"missing task", `{"_ng_rollout_index": 2}`, EpisodeID{}, "", required},
		{"attempt 'invalid' raises", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_attempt_index": "invalid"}`, EpisodeID{}, "", invalid},

		// test_base_responses_api_model.py::test_maybe_rollout_id_from_run_body_prefers_an_explicit_id
		{"explicit id beats indexes", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_rollout_id": "s7-3-2"}`, EpisodeID{"s7-3-2", 0}, "s7-3-2", ok},
		{"retry of an explicit id", `{"_ng_rollout_id": "s7-3-2", "_ng_attempt_index": 1}`, EpisodeID{"s7-3-2", 1}, "s7-3-2-a1", ok},
		{"explicit id needs no indexes", `{"_ng_rollout_id": "abc"}`, EpisodeID{"abc", 0}, "abc", ok},

		// test_base_responses_api_model.py::test_maybe_rollout_id_from_run_body_refuses_an_unusable_explicit_id
		{"explicit .hidden", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_rollout_id": ".hidden"}`, EpisodeID{}, "", invalid},
		{"explicit has/slash", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_rollout_id": "has/slash"}`, EpisodeID{}, "", invalid},
		{"explicit has space", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_rollout_id": "has space"}`, EpisodeID{}, "", invalid},
		{"explicit empty", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_rollout_id": ""}`, EpisodeID{}, "", invalid},
		{"explicit 7", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_rollout_id": 7}`, EpisodeID{}, "", invalid},
		{"explicit null: derivation runs", `{"_ng_task_index": 3, "_ng_rollout_index": 2, "_ng_rollout_id": null}`, EpisodeID{"3-2", 0}, "3-2", ok},

		// test_base_responses_api_model.py::test_explicit_rollout_ids_round_trip_through_the_path_prefix
		{"round trip s7-3-2", `{"_ng_rollout_id": "s7-3-2"}`, EpisodeID{"s7-3-2", 0}, "s7-3-2", ok},
		{"round trip step7.task3", `{"_ng_rollout_id": "step7.task3"}`, EpisodeID{"step7.task3", 0}, "step7.task3", ok},
		{"round trip a", `{"_ng_rollout_id": "a"}`, EpisodeID{"a", 0}, "a", ok},
		{"round trip A_b-1.2", `{"_ng_rollout_id": "A_b-1.2"}`, EpisodeID{"A_b-1.2", 0}, "A_b-1.2", ok},

		// test_rollout_correlation.py::test_verify_correlates_policy_and_judge_calls_and_preserves_raw_capture
		// and ::test_rollout_id_does_not_serialize_run_body
		{"collector row 4-2", `{"_ng_task_index": 4, "_ng_rollout_index": 2, "responses_create_params": {"input": "solve"}}`, EpisodeID{"4-2", 0}, "4-2", ok},
		// test_rollout_correlation.py::test_explicit_rollout_alias_stays_request_scoped
		{"explicit alias", `{"_ng_rollout_id": "rollout-explicit", "responses_create_params": {"input": "solve"}}`, EpisodeID{"rollout-explicit", 0}, "rollout-explicit", ok},
		// Gym's rollout-collection test of an explicit id ("step7.0-0" wins over the indexes that would derive 0-0)
		{"explicit id from a dataset row", `{"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_rollout_id": "step7.0-0"}`, EpisodeID{"step7.0-0", 0}, "step7.0-0", ok},

		// test_execution_identity_from_run_body (the checkpoint branch's execution-identity tests)
		{"execution identity 4-2", `{"_ng_task_index": 4, "_ng_rollout_index": 2}`, EpisodeID{"4-2", 0}, "4-2", ok},
		{"execution identity 4-2 attempt 3", `{"_ng_task_index": 4, "_ng_rollout_index": 2, "_ng_attempt_index": 3}`, EpisodeID{"4-2", 3}, "4-2-a3", ok},
		// Gym's twin takes ("run-a1", 0); EpisodeId (episode_types.py 05bf55a)
		// refuses a rollout id ending with the reserved suffix, so it cannot
		// be checkpointed and is refused here.
		{"explicit id with the reserved suffix", `{"_ng_rollout_id": "run-a1", "_ng_attempt_index": 0}`, EpisodeID{}, "", invalid},

		// Ours: what Gym's Python formats but an EpisodeId cannot hold, or a
		// number Python's int() would silently change.
		{"string indexes kept as is", `{"_ng_task_index": "7", "_ng_rollout_index": 0}`, EpisodeID{"7-0", 0}, "7-0", ok},
		{"string task name", `{"_ng_task_index": "taskA", "_ng_rollout_index": 1}`, EpisodeID{"taskA-1", 0}, "taskA-1", ok},
		{"bool task index", `{"_ng_task_index": true, "_ng_rollout_index": 1}`, EpisodeID{}, "", invalid},
		{"float task index", `{"_ng_task_index": 3.0, "_ng_rollout_index": 1}`, EpisodeID{}, "", invalid},
		{"negative rollout index", `{"_ng_task_index": 3, "_ng_rollout_index": -1}`, EpisodeID{}, "", invalid},
		{"object rollout index", `{"_ng_task_index": 3, "_ng_rollout_index": {}}`, EpisodeID{}, "", invalid},
		{"string index outside the pattern", `{"_ng_task_index": "a b", "_ng_rollout_index": 1}`, EpisodeID{}, "", invalid},
		{"null task index is missing", `{"_ng_task_index": null, "_ng_rollout_index": 1}`, EpisodeID{}, "", required},
		{"malformed attempt without identity", `{"_ng_attempt_index": "soon"}`, EpisodeID{}, "", required},
		{"attempt null is 0", `{"_ng_task_index": 1, "_ng_rollout_index": 1, "_ng_attempt_index": null}`, EpisodeID{"1-1", 0}, "1-1", ok},
		{"integral float attempt", `{"_ng_task_index": 1, "_ng_rollout_index": 1, "_ng_attempt_index": 2.0}`, EpisodeID{"1-1", 2}, "1-1-a2", ok},
		{"fractional attempt", `{"_ng_task_index": 1, "_ng_rollout_index": 1, "_ng_attempt_index": 2.5}`, EpisodeID{}, "", invalid},
		{"bool attempt", `{"_ng_task_index": 1, "_ng_rollout_index": 1, "_ng_attempt_index": true}`, EpisodeID{}, "", invalid},
		{"negative attempt", `{"_ng_task_index": 1, "_ng_rollout_index": 1, "_ng_attempt_index": -1}`, EpisodeID{}, "", invalid},
		{"negative attempt string", `{"_ng_task_index": 1, "_ng_rollout_index": 1, "_ng_attempt_index": "-1"}`, EpisodeID{}, "", invalid},
		{"empty attempt string", `{"_ng_task_index": 1, "_ng_rollout_index": 1, "_ng_attempt_index": ""}`, EpisodeID{}, "", invalid},
		{"explicit id with a trailing newline", `{"_ng_rollout_id": "abc\n"}`, EpisodeID{}, "", invalid},
		{"not an object", `[1, 2]`, EpisodeID{}, "", invalid},
		{"not JSON", `{"_ng_rollout_id": `, EpisodeID{}, "", invalid},
		{"two values", `{} {}`, EpisodeID{}, "", invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RunIdentity([]byte(tc.body))
			switch tc.err {
			case ok:
				if err != nil {
					t.Fatalf("RunIdentity(%s) = %v", tc.body, err)
				}
				if got != tc.want || got.CaptureKey() != tc.key {
					t.Fatalf("RunIdentity(%s) = %+v (key %q), want %+v (key %q)", tc.body, got, got.CaptureKey(), tc.want, tc.key)
				}
			case required:
				if !errors.Is(err, ErrRolloutIDRequired) {
					t.Fatalf("RunIdentity(%s) = %+v, %v; want ErrRolloutIDRequired", tc.body, got, err)
				}
				if status, code := Classify(err); status != http.StatusBadRequest || code != CodeRolloutIDRequired {
					t.Fatalf("Classify(%v) = %d %s, want 400 rollout_id_required", err, status, code)
				}
			case invalid:
				if !errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrRolloutIDRequired) {
					t.Fatalf("RunIdentity(%s) = %+v, %v; want ErrInvalidRequest", tc.body, got, err)
				}
				if strings.Contains(err.Error(), "\n") || err.Error() == "" {
					t.Fatalf("detail %q is not one line", err.Error())
				}
			}
		})
	}
}

// The detail of a refusal names the field that is wrong and the value.
func TestRunIdentityDetails(t *testing.T) {
	for body, want := range map[string]string{
		`{"_ng_rollout_id": 7}`:                                                      `_ng_rollout_id must be a string`,
		`{"_ng_rollout_id": "has/slash"}`:                                            `"has/slash"`,
		`{"_ng_task_index": true, "_ng_rollout_index": 1}`:                           `_ng_task_index must be a non-negative integer or a string, got true`,
		`{"_ng_task_index": 1, "_ng_rollout_index": 1, "_ng_attempt_index": "soon"}`: `_ng_attempt_index must be a non-negative integer, got "soon"`,
		`{"_ng_rollout_id": "run-a1"}`:                                               `reserved attempt suffix`,
		`{}`:                                                                         `_ng_rollout_id, or _ng_task_index and _ng_rollout_index`,
	} {
		_, err := RunIdentity([]byte(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("RunIdentity(%s) = %v, want a detail containing %q", body, err, want)
		}
	}
}

// RunIdentityFields takes the body already split, as a /run handler that
// decoded it once has it.
func TestRunIdentityFields(t *testing.T) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(`{"_ng_task_index": 9, "_ng_rollout_index": 4, "_ng_attempt_index": 1}`), &fields); err != nil {
		t.Fatal(err)
	}
	id, err := RunIdentityFields(fields)
	if err != nil || id != (EpisodeID{"9-4", 1}) {
		t.Fatalf("RunIdentityFields = %+v, %v", id, err)
	}
	if _, err := RunIdentityFields(nil); !errors.Is(err, ErrRolloutIDRequired) {
		t.Fatalf("RunIdentityFields(nil) = %v, want ErrRolloutIDRequired", err)
	}
}

// Ports TestDecodeRolloutId (test_rollout_correlation.py): Gym reads a
// capture key back into its parts. Here a key reads back into the
// EpisodeID RunIdentity made it from (the task/rollout split stays in the
// rollout id), and a custom id is attempt 0 of itself.
func TestCaptureKeyReadsBackRunIdentity(t *testing.T) {
	for key, want := range map[string]EpisodeID{
		"4-2":                  {"4-2", 0}, // test_decodes_task_and_rollout_index
		"4-2-a3":               {"4-2", 3}, // test_decodes_an_attempt_suffix
		"my-custom-rollout-id": {"my-custom-rollout-id", 0},
	} {
		got, err := ParseCaptureKey(key)
		if err != nil || got != want {
			t.Errorf("ParseCaptureKey(%q) = %+v, %v; want %+v", key, got, err, want)
		}
	}
	// test_none_and_empty_do_not_decode
	if _, err := ParseCaptureKey(""); err == nil {
		t.Error(`ParseCaptureKey("") succeeded`)
	}
}
