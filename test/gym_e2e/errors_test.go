package gyme2e

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/gym"
)

// TestErrorCodes: every refusal the agent can answer (but
// restart_in_scope, in TestRestartRuns, stale_attempt, in TestRetireForget,
// and checkpoint_error, in TestRestoreIntoLiveProcess), in Gym's envelope
// with its code's status, each provoked the way a Gym deployment would
// meet it; the control-plane ones on the owner too. Routes are matched
// before anything else (404 unknown route, 405 wrong method), then the
// token is checked (401 unauthorized) before the body is read, then a body
// that fails validation gets FastAPI's 422 {"detail": [...]}.
func TestErrorCodes(t *testing.T) {
	w := newWorld(t, options{})
	deadline := deadlineIn(waitLimit)
	id := ckID("errors")

	for _, m := range w.coord.members {
		if r := w.coord.call(m.Name, m.URL, "nope", map[string]any{}, w.coord.bearer()); r.status != http.StatusNotFound {
			t.Errorf("%s: want 404 for an unknown control route", r)
		}
		if r := w.coord.call(m.Name, m.URL, gym.OpPrepare, nil, w.coord.bearer()); r.status != http.StatusMethodNotAllowed {
			t.Errorf("GET %s: want 405", r)
		}
		for _, bad := range []any{
			`{"checkpoint_id": "x", "deadline_ts": 1, "surprise": 1}`, // unknown field
			map[string]any{"checkpoint_id": ".hidden", "deadline_ts": deadline},
			map[string]any{"checkpoint_id": id},
			`not json`,
		} {
			checkValidation(t, w.coord.to(m, gym.OpPrepare, bad))
		}
		checkValidation(t, w.coord.to(m, gym.OpRetire, map[string]any{"checkpoint_id": id, "deadline_ts": deadline, "episode_ids": []any{}}))
		checkValidation(t, w.coord.to(m, gym.OpRetire, map[string]any{"checkpoint_id": id, "deadline_ts": deadline,
			"episode_ids": []any{map[string]any{"rollout_id": "r-a1", "attempt": 0}}}))
		checkValidation(t, w.coord.to(m, gym.OpRestore, map[string]any{"checkpoint_id": id, "deadline_ts": deadline, "checkpoint_dir": w.dir}))
		for _, auth := range []string{"", "Bearer nope", "Basic " + w.token} {
			checkRefusal(t, w.coord.call(m.Name, m.URL, gym.OpPrepare, plainBody(id, deadline), auth), gym.CodeUnauthorized)
		}
		// A deadline already past: operations bounded by _within refuse
		// (Gym's prepare does not: it answers at once with what it has).
		checkRefusal(t, w.coord.to(m, gym.OpForget, map[string]any{"checkpoint_id": id, "deadline_ts": deadlineIn(-time.Second),
			"rollout_ids": []string{"1-0"}}), gym.CodeDeadlineExceeded)
		checkRefusal(t, w.coord.to(m, gym.OpCommit, commitBody(id, w.checkpointDir(id), nil, false, deadline)), gym.CodeInvalidPhase)
		// A folder without this participant's manifest; then one whose
		// records file does not match its digest.
		empty := filepath.Join(w.dir, "empty-checkpoint")
		os.MkdirAll(empty, 0o755)
		checkRefusal(t, w.coord.to(m, gym.OpRestore, restoreBody(ckID("restore-empty"), empty, nil, deadline)), gym.CodeCheckpointState)
	}

	// The data plane: a row without identity, a malformed explicit id, a
	// malformed attempt index.
	noID := w.coll.row(1, 0, job{steps: 1, stepS: 0.05})
	delete(noID, gym.FieldTaskIndex)
	w.coll.post(t.Context(), noID).refusal(t, gym.CodeRolloutIDRequired)
	bad := w.coll.row(1, 0, job{steps: 1, stepS: 0.05})
	bad[gym.FieldRolloutID] = "../escape"
	if r := w.coll.post(t.Context(), bad); r.status != http.StatusUnprocessableEntity {
		t.Errorf("%s: want 422 for a malformed _ng_rollout_id", r)
	}

	// A committed checkpoint, tampered with on disk: invalid_checkpoint_state.
	r := w.coll.row(2, 0, job{steps: 6, stepS: 0.3})
	ch := w.coll.start(r)
	w.waitStepped(rolloutID(r))
	// The same attempt posted again while it runs is refused (409 in the
	// envelope; Gym's agent fails it with a 500) and leaves the run alone.
	if dup := w.coll.post(t.Context(), r); dup.status != http.StatusConflict {
		t.Errorf("%s: want 409 for a second /run of an attempt in flight", dup)
	} else if _, err := checkShape("duplicate refusal", dup.body, envelopeShape); err != nil {
		t.Error(err)
	}
	for _, attempt := range []any{-1, "abc", 1.5, true} {
		b := w.coll.row(4, 0, job{steps: 1, stepS: 0.05})
		b[gym.FieldAttemptIndex] = attempt
		if res := w.coll.post(t.Context(), b); res.status != http.StatusUnprocessableEntity {
			t.Errorf("%s: want 422 for _ng_attempt_index %v", res, attempt)
		}
	}
	ck := w.checkpoint(id, episodes(r), false)
	// While prepared/committed, new work is parked out.
	w.coll.post(t.Context(), w.coll.row(3, 0, job{steps: 1, stepS: 0.05})).refusal(t, gym.CodeCheckpointParked)
	w.coord.resume(id, deadline)
	checkOneLaunch(t, w, rolloutID(r), await(t, ch).reply(t), 6, 1)

	for _, m := range w.coord.members {
		recordsFile, _ := ck.commits[m.Name].Manifest["records_file"].(string)
		path := filepath.Join(ck.dir, "gym", m.Kind, m.Instance, recordsFile)
		if err := os.WriteFile(path, []byte("{\"episode_id\": {\"rollout_id\": \"x\", \"attempt\": 0}}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		checkRefusal(t, w.coord.to(m, gym.OpRestore, restoreBody(ckID("restore-tampered"), ck.dir, ck.scope, deadline)), gym.CodeCheckpointState)
		if st := w.coord.status(m); st.Phase != gym.PhaseIdle {
			t.Errorf("%s after a failed restore: phase %s, want idle", m.Name, st.Phase)
		}
	}
	// Nothing refused is lost: a new row runs.
	checkOneLaunch(t, w, "4-0", w.coll.post(t.Context(), w.coll.row(4, 0, job{steps: 2, stepS: 0.05})).reply(t), 2, 0)
}

// TestRestoreIntoLiveProcess: a restore sent to an agent that serves a
// live run is refused 409 checkpoint_error (Gym's agent install needs a
// process without live sessions) and changes nothing: the agent is idle
// and accepting again, and the live run finishes with every step once.
// The resources participant is not asked: `ngdriver owner serve` outlives
// a crash of the driver, and a restore into it replaces the sessions it
// restores (docs/gym.md, "Left out, and why").
func TestRestoreIntoLiveProcess(t *testing.T) {
	w := newWorld(t, options{})
	r := w.coll.row(2, 0, job{steps: 6, stepS: 0.3})
	ch := w.coll.start(r)
	w.waitStepped(rolloutID(r))
	id := ckID("live")
	ck := w.checkpoint(id, episodes(r), false)
	deadline := deadlineIn(waitLimit)
	w.coord.resume(id, deadline)
	for _, m := range w.coord.members {
		if m.Kind != gym.KindAgent {
			continue
		}
		live := ckID("restore-live-" + m.Kind)
		r := w.coord.to(m, gym.OpRestore, restoreBody(live, ck.dir, ck.scope, deadline))
		checkRefusal(t, r, gym.CodeRefused)
		if r.status == http.StatusOK {
			// Reopen what the wrongly accepted restore closed, so the live run can finish.
			w.coord.checkResume(w.coord.to(m, gym.OpResume, plainBody(live, deadline)))
		}
		if st := w.coord.status(m); st.Phase != gym.PhaseIdle || (st.Accepting != nil && !*st.Accepting) {
			t.Errorf("%s after a refused restore: %+v, want idle and accepting", m.Name, st)
		}
	}
	// The refused restore closed admission for a moment, which may have
	// paused the run once more.
	checkOneLaunch(t, w, rolloutID(r), await(t, ch).reply(t), 6, -1)
}
