package gym

import (
	"encoding/json"
	"fmt"
	"testing"
)

// Every code of errors.py (14f23fa, plus restart_in_scope as control.py
// 011c338 imports it) with its HTTP status, through one Classify.
func TestClassifyEveryCode(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{ErrRefused, 409, "checkpoint_error"},
		{ErrStaleCheckpoint, 409, "stale_checkpoint"},
		{ErrCheckpointConflict, 409, "checkpoint_conflict"},
		{ErrInvalidPhase, 409, "invalid_phase"},
		{ErrDeadlineExceeded, 409, "deadline_exceeded"},
		{ErrStaleAttempt, 409, "stale_attempt"},
		{ErrCheckpointParked, 409, "checkpoint_parked"},
		{ErrRestartInScope, 409, "restart_in_scope"},
		{ErrRolloutIDRequired, 400, "rollout_id_required"},
		{ErrUnauthorized, 401, "unauthorized"},
		{ErrCheckpointState, 422, "invalid_checkpoint_state"},
		{ErrInvalidRequest, 422, "invalid_request"},
		{fmt.Errorf("plain"), 500, "internal_error"},
	} {
		for _, err := range []error{tc.err, Refuse(tc.err, "detail"), fmt.Errorf("wrapped: %w", Refuse(tc.err, "x"))} {
			if status, code := Classify(err); status != tc.status || code != tc.code {
				t.Errorf("Classify(%v) = %d %s, want %d %s", err, status, code, tc.status, tc.code)
			}
		}
	}
}

// The envelope is {"error": {"code", "detail"}} and the detail is the
// text alone.
func TestEnvelope(t *testing.T) {
	status, body := Envelope(Refuse(ErrStaleCheckpoint, "checkpoint %q was already resumed", "c1"))
	data, _ := json.Marshal(body)
	if status != 409 || string(data) != `{"error":{"code":"stale_checkpoint","detail":"checkpoint \"c1\" was already resumed"}}` {
		t.Fatalf("envelope = %d %s", status, data)
	}
}
