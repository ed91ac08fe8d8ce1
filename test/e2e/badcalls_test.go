package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/serve"
	"github.com/ngharness/ngharness/pkg/gym"
)

// wantPhase checks /healthz reports phase, failing t.
func (e *env) wantPhase(t *testing.T, phase string) {
	t.Helper()
	if h := e.healthOf(t); h.Phase != phase {
		t.Errorf("/healthz phase %q, want %q", h.Phase, phase)
	}
}

// runRefused checks a /run reply is a refusal in Gym's envelope.
func runRefused(t *testing.T, r runReply, status int, code string, words ...string) {
	t.Helper()
	if r.err != nil {
		t.Errorf("%s", r)
		return
	}
	wantRefused(t, ctlReply{call: "run " + r.rollout, status: r.status, body: r.body}, status, code, words...)
}

// refusedCall is one call a participant must refuse: how it is sent (when
// its subtest runs, so its deadline is fresh) and what the refusal says.
type refusedCall struct {
	name   string
	send   func(t *testing.T) ctlReply
	status int
	code   string
	words  []string
}

// checkRefused runs each call as a subtest of its own: the refusal, then
// the driver's phase, which a refused call leaves as it was.
func (e *env) checkRefused(t *testing.T, phase string, calls []refusedCall) {
	t.Helper()
	for _, rc := range calls {
		t.Run(rc.name, func(t *testing.T) {
			wantRefused(t, rc.send(t), rc.status, rc.code, rc.words...)
			e.wantPhase(t, phase)
		})
	}
}

// TestBadCalls: Gym's control plane refuses what is out of order with its
// codes and changes nothing: a call the phase does not allow is 409
// invalid_phase, another checkpoint id while one is active 409
// checkpoint_conflict naming the active one, a resumed id 409
// stale_checkpoint (a resume with nothing open answers idempotent and
// fences its id); a completed prepare or commit is replayed for its id. A
// wrong or missing token is 401 unauthorized, before the body is read; a
// body that fails validation (unknown fields too) is FastAPI's 422; /run without identity
// is 400 rollout_id_required, a second run of a rollout in flight 409
// run_in_flight, a new rollout while a checkpoint is open 409
// checkpoint_parked. A commit that cannot write is 422
// invalid_checkpoint_state and commits nothing. A checkpoint folder whose
// manifest is missing, of another schema or participant, whose records
// file is cut or does not match its digest, or whose record is of an
// unknown bookmark version or another adapter, makes restore answer 422
// invalid_checkpoint_state naming the file (or the episode), installs
// nothing (the next attempt starts at seed) and leaves the folder as it
// was; a good one restores under the restore's own id, answering the
// source checkpoint and the capture key of attempt + 1. The participant
// works after each of them.
//
// One owner and driver serve every case. Each case is a subtest that fails
// alone: the calls refused in idle first, in any order; then one run walks
// a checkpoint through its phases, this function moving the phases (each
// needs the one before) and the subtests checking what each phase refuses
// and answers; last, the committed checkpoint broken in copies, each
// restored alone, then restored whole.
func TestBadCalls(t *testing.T) {
	const steps = 12
	e := newEnv(t, options{steps: steps})
	c := e.ctl
	e.wantPhase(t, "idle")

	// Out of order, in idle.
	t.Run("idle/commit", func(t *testing.T) {
		wantRefused(t, c.call(t, "commit", commitBody("x", filepath.Join(e.dir, "x"), nil, false)), http.StatusConflict, gym.CodeInvalidPhase, "idle")
		if _, err := os.Stat(filepath.Join(e.dir, "x")); err == nil {
			t.Errorf("a refused commit wrote its checkpoint_dir")
		}
		e.wantPhase(t, "idle")
	})
	// The resume fences its id: the prepare after it says so.
	t.Run("idle/resume-fences", func(t *testing.T) {
		var res0 gym.ResumeReply
		c.must(t, "resume", plainBody("fenced"), &res0)
		if res0.Phase != gym.PhaseIdle || !res0.Idempotent {
			t.Errorf("resume with nothing open answered %+v, want idle, idempotent", res0)
		}
		wantRefused(t, c.call(t, "prepare", plainBody("fenced")), http.StatusConflict, gym.CodeStaleCheckpoint, `"fenced"`)
		e.wantPhase(t, "idle")
	})

	// Tokens: wrong, missing, another scheme. Nothing changes.
	for name, auth := range map[string]string{
		"wrong":   "Bearer not-the-token",
		"missing": "",
		"empty":   "Bearer ",
		"basic":   "Basic " + e.token,
		"suffix":  "Bearer " + e.token + "x",
	} {
		t.Run("token/"+name, func(t *testing.T) {
			r := c.raw(t, "prepare", auth, plainBody("tok-"+name))
			wantRefused(t, r, http.StatusUnauthorized, gym.CodeUnauthorized)
			wantRefused(t, c.rawStatus(t, auth), http.StatusUnauthorized, gym.CodeUnauthorized)
			e.wantPhase(t, "idle")
			// The owner's control plane is Gym's too.
			wantRefused(t, e.own.raw(t, "prepare", auth, plainBody("tok-"+name)), http.StatusUnauthorized, gym.CodeUnauthorized)
			wantRefused(t, e.own.rawStatus(t, auth), http.StatusUnauthorized, gym.CodeUnauthorized)
			if s := e.own.status(t); s.Phase != gym.PhaseIdle || s.CheckpointID != nil {
				t.Errorf("owner status after a prepare with a %s token: %+v, want idle", name, s)
			}
		})
	}

	// Bodies that fail validation: 422 once the token is right, and
	// nothing changes.
	for name, body := range map[string]string{
		"not json":        `{"checkpoint_id": `,
		"not an object":   `["x"]`,
		"no id":           `{"deadline_ts":1}`,
		"no deadline":     `{"checkpoint_id":"ok"}`,
		"wrong type":      `{"checkpoint_id":7,"deadline_ts":1}`,
		"deadline string": `{"checkpoint_id":"ok","deadline_ts":"soon"}`,
		"bad id":          `{"checkpoint_id":"dup:1","deadline_ts":1}`,
		"long id":         `{"checkpoint_id":"` + strings.Repeat("k", 129) + `","deadline_ts":1}`,
		"unknown field":   `{"checkpoint_id":"ok","deadline_ts":1,"records":true}`,
		"two values":      `{"checkpoint_id":"ok","deadline_ts":1} {}`,
	} {
		t.Run("body/"+name, func(t *testing.T) {
			r := c.call(t, "prepare", body)
			if r.status != http.StatusUnprocessableEntity || r.errorCode() != gym.CodeInvalidRequest || r.errorText() == "" {
				t.Errorf("prepare with a body %s (%s): %s, want 422 with an error", name, body, r)
			}
			e.wantPhase(t, "idle")
		})
	}
	t.Run("fields", func(t *testing.T) {
		e.checkRefused(t, "idle", []refusedCall{
			{"unknown-named", func(t *testing.T) ctlReply {
				return c.call(t, "prepare", `{"checkpoint_id":"ok","deadline_ts":1,"x":1}`)
			}, http.StatusUnprocessableEntity, gym.CodeInvalidRequest, []string{`"x"`}},
			// The token is checked before the body is read.
			{"token-before-body", func(t *testing.T) ctlReply {
				return c.raw(t, "prepare", "Bearer nope", `{"checkpoint_id":"ok","deadline_ts":1,"x":1}`)
			}, http.StatusUnauthorized, gym.CodeUnauthorized, nil},
			{"retire-no-episodes", func(t *testing.T) ctlReply {
				return c.call(t, "retire", map[string]any{"checkpoint_id": "ok", "deadline_ts": deadline(time.Minute), "episode_ids": []any{}})
			}, http.StatusUnprocessableEntity, gym.CodeInvalidRequest, []string{"episode_ids"}},
			{"restore-no-episodes", func(t *testing.T) ctlReply {
				return c.call(t, "restore", map[string]any{"checkpoint_id": "ok", "deadline_ts": deadline(time.Minute), "checkpoint_dir": e.dir})
			}, http.StatusUnprocessableEntity, gym.CodeInvalidRequest, []string{"episode_ids"}},
			{"commit-episode-without-attempt", func(t *testing.T) ctlReply {
				return c.call(t, "commit", map[string]any{"checkpoint_id": "ok", "deadline_ts": deadline(time.Minute), "checkpoint_dir": e.dir,
					"episode_ids": []any{map[string]any{"rollout_id": "r-a1"}}})
			}, http.StatusUnprocessableEntity, gym.CodeInvalidRequest, []string{"r-a1"}},
		})
	})
	t.Run("unknown-route", func(t *testing.T) {
		if r := c.call(t, "snapshot", plainBody("ok")); r.status != http.StatusNotFound {
			t.Errorf("an unknown control route: %s, want 404", r)
		}
		e.wantPhase(t, "idle")
	})
	for name, body := range map[string]string{"not json": `{"_ng_rollout_id":`, "an array": `[1]`} {
		t.Run("run-body/"+name, func(t *testing.T) {
			runRefused(t, postRun(t.Context(), c.url, "/run", name, body), http.StatusUnprocessableEntity, gym.CodeInvalidRequest)
		})
	}
	for name, body := range map[string]string{
		"no identity":        `{"task":"x"}`,
		"the old rollout_id": `{"rollout_id":"` + e.rollout("old") + `","task":"x"}`,
		"a task index alone": `{"_ng_task_index":3,"task":"x"}`,
		"null":               `null`,
	} {
		t.Run("run-identity/"+name, func(t *testing.T) {
			runRefused(t, postRun(t.Context(), c.url, "/run", name, body), http.StatusBadRequest, gym.CodeRolloutIDRequired, gym.FieldRolloutID)
		})
	}

	// A run, and a prepare whose deadline has passed while it runs: the
	// phase stays preparing.
	id := e.rollout("r0")
	ch := e.startRun("/run", id, e.body(id, steps, e.opts.stepS))
	e.waitStepped(id)
	// The same rollout while it is in flight, as the same attempt or
	// another: 409, and the first goes on.
	for name, b := range map[string]map[string]any{
		"same-attempt":  e.body(id, steps, e.opts.stepS),
		"other-attempt": withAttempt(e.body(id, steps, e.opts.stepS), 1),
	} {
		t.Run("in-flight/"+name, func(t *testing.T) {
			runRefused(t, postRun(t.Context(), c.url, "/run", id, b), http.StatusConflict, serve.CodeRunInFlight, id)
		})
	}
	ckID := e.prefix + "-ck1"
	var prep prepared
	r := c.call(t, "prepare", map[string]any{"checkpoint_id": ckID, "deadline_ts": deadline(-time.Second)})
	if r.status != http.StatusOK {
		t.Fatalf("%s", r)
	}
	if err := json.Unmarshal(r.body, &prep); err != nil {
		t.Fatal(err)
	}
	emptyDir := filepath.Join(e.dir, "empty-ck")
	os.MkdirAll(emptyDir, 0o755)
	if prep.Phase == gym.PhasePrepared {
		// The run parked before the deadline was even looked at: the
		// phase is prepared, not preparing.
		t.Logf("the run parked at once; the calls in preparing are checked in prepared")
	} else {
		t.Run("preparing", func(t *testing.T) {
			if prep.Phase != gym.PhasePreparing || prep.Report.Ready || !slices.Equal(prep.Report.Blockers, []string{id}) || prep.Report.BlockerCount != 1 {
				t.Errorf("prepare past its deadline: %+v, want preparing, blocked by [%s]", prep, id)
			}
			e.wantPhase(t, "preparing")
			e.checkRefused(t, "preparing", []refusedCall{
				{"restore", func(t *testing.T) ctlReply { return c.call(t, "restore", restoreBody(ckID, emptyDir, nil)) },
					http.StatusConflict, gym.CodeInvalidPhase, []string{"preparing"}},
				{"commit", func(t *testing.T) ctlReply {
					return c.call(t, "commit", commitBody(ckID, filepath.Join(e.dir, "y"), nil, false))
				}, http.StatusConflict, gym.CodeInvalidPhase, []string{"preparing"}},
				{"prepare-other", func(t *testing.T) ctlReply { return c.call(t, "prepare", plainBody(e.prefix+"-other")) },
					http.StatusConflict, gym.CodeConflict, []string{ckID, "preparing"}},
				{"retire", func(t *testing.T) ctlReply {
					return c.call(t, "retire", map[string]any{"checkpoint_id": ckID, "deadline_ts": deadline(time.Minute), "episode_ids": episodes(id)})
				}, http.StatusConflict, gym.CodeInvalidPhase, []string{"preparing"}},
			})
		})
		// The same prepare again waits for the run to park.
		c.must(t, "prepare", plainBody(ckID), &prep)
	}
	if prep.Phase != gym.PhasePrepared || !prep.Report.Ready || prep.Report.Counts["sessions"] != 1 || prep.Report.Counts["at_boundary"] != 1 {
		t.Fatalf("prepare: %+v, want the run parked", prep)
	}
	late := e.rollout("late")
	t.Run("prepared", func(t *testing.T) {
		e.wantPhase(t, "prepared")
		e.checkRefused(t, "prepared", []refusedCall{
			{"prepare-other", func(t *testing.T) ctlReply { return c.call(t, "prepare", plainBody(e.prefix+"-other")) },
				http.StatusConflict, gym.CodeConflict, []string{ckID, "prepared"}},
			{"restore", func(t *testing.T) ctlReply { return c.call(t, "restore", restoreBody(ckID, emptyDir, nil)) },
				http.StatusConflict, gym.CodeInvalidPhase, []string{"prepared"}},
			{"commit-other", func(t *testing.T) ctlReply {
				return c.call(t, "commit", commitBody(e.prefix+"-other", filepath.Join(e.dir, "other"), nil, false))
			}, http.StatusConflict, gym.CodeConflict, []string{ckID}},
			// A wrong or missing token in prepared changes nothing either:
			// no resume, no records written.
			{"resume-wrong-token", func(t *testing.T) ctlReply { return c.raw(t, "resume", "Bearer nope", plainBody(ckID)) },
				http.StatusUnauthorized, gym.CodeUnauthorized, nil},
			{"commit-no-token", func(t *testing.T) ctlReply {
				return c.raw(t, "commit", "", commitBody(ckID, filepath.Join(e.dir, "tok-commit"), nil, false))
			}, http.StatusUnauthorized, gym.CodeUnauthorized, nil},
		})
		t.Run("commit-no-token-wrote-nothing", func(t *testing.T) {
			if _, err := os.Stat(filepath.Join(e.dir, "tok-commit")); err == nil {
				t.Errorf("an unauthorized commit wrote its checkpoint_dir")
			}
		})
		t.Run("prepare-replayed", func(t *testing.T) {
			var again prepared
			c.must(t, "prepare", plainBody(ckID), &again)
			if again.Phase != gym.PhasePrepared {
				t.Errorf("the same prepare again answered %+v, want its reply replayed", again)
			}
		})
		// A new rollout while the checkpoint holds admission closed.
		t.Run("new-run-parked", func(t *testing.T) {
			runRefused(t, postRun(t.Context(), c.url, "/run", late, e.body(late, 2, 0.05)), http.StatusConflict, gym.CodeCheckpointParked, late)
		})
	})

	ckDir := filepath.Join(e.dir, "checkpoints", ckID)
	// A commit that cannot write its records fails and commits nothing:
	// the phase stays prepared. As in Gym, the checkpoint's one export is
	// then written again only to the same folder and scope (another is
	// 409 checkpoint_conflict), and once the folder can be written a
	// retried commit succeeds. The steps of this subtest are in order: the
	// failed commit binds the export to its folder and scope.
	blocker := filepath.Dir(ckDir)
	if err := os.WriteFile(blocker, []byte("not a folder"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("commit-cannot-write", func(t *testing.T) {
		wantRefused(t, c.call(t, "commit", commitBody(ckID, ckDir, nil, false)), http.StatusUnprocessableEntity, gym.CodeCheckpointState, ckDir)
		e.wantPhase(t, "prepared")
		wantRefused(t, c.call(t, "commit", commitBody(ckID, "/dev/null/ck", nil, false)), http.StatusConflict, gym.CodeConflict, ckID)
		wantRefused(t, c.call(t, "commit", commitBody(ckID, ckDir, episodes(id), false)), http.StatusConflict, gym.CodeConflict, ckID)
		e.wantPhase(t, "prepared")
	})
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	// The owner is prepared after the driver (Gym's order), and both
	// commit into the same folder.
	e.prepareOwner(ckID)
	var com committed
	c.must(t, "commit", commitBody(ckID, ckDir, nil, false), &com)
	ownCom, _ := e.commitOwner(ckID, ckDir, nil, false)
	t.Run("committed", func(t *testing.T) {
		checkCommitted(t, ckDir, ckID, com)
		if !slices.Equal(ownCom.EpisodeIDs, []string{id}) {
			t.Errorf("the owner's commit answered %+v, want the session of %s", ownCom, id)
		}
		e.wantPhase(t, "committed")
		t.Run("commit-replayed", func(t *testing.T) {
			var com2 committed
			c.must(t, "commit", commitBody(ckID, ckDir, nil, false), &com2)
			if com2.Manifest != com.Manifest || !slices.Equal(com2.EpisodeIDs, com.EpisodeIDs) {
				t.Errorf("the same commit again answered %+v, want its reply replayed %+v", com2, com)
			}
		})
		e.checkRefused(t, "committed", []refusedCall{
			{"restore", func(t *testing.T) ctlReply { return c.call(t, "restore", restoreBody(ckID, ckDir, nil)) },
				http.StatusConflict, gym.CodeInvalidPhase, []string{"committed"}},
			{"prepare-other", func(t *testing.T) ctlReply { return c.call(t, "prepare", plainBody(e.prefix+"-other")) },
				http.StatusConflict, gym.CodeConflict, []string{ckID, "committed"}},
		})
	})
	e.resumeAll(ckID)
	t.Run("resumed", func(t *testing.T) {
		var res1 gym.ResumeReply
		c.must(t, "resume", plainBody(ckID), &res1)
		if !res1.Idempotent {
			t.Errorf("a second resume of %s answered %+v, want idempotent", ckID, res1)
		}
		wantRefused(t, c.call(t, "prepare", plainBody(ckID)), http.StatusConflict, gym.CodeStaleCheckpoint, ckID)
	})
	// The participant still works: the run finishes, paused once.
	t.Run("run-finishes", func(t *testing.T) {
		res := await(t, ch).result(t)
		checkOneLaunch(t, e, id, res, steps, 1)
	})

	// Bad checkpoint folders: copies of the committed one, each broken.
	good := participantDir(ckDir)
	man, err := os.ReadFile(filepath.Join(good, gym.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	recName := "records-" + com.Manifest.RecordsSHA256 + ".jsonl"
	recs, err := os.ReadFile(filepath.Join(good, recName))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(recs, []byte("\n")); n != 1 {
		t.Fatalf("the records file has %d lines, want the run's:\n%s", n, recs)
	}
	var ar driver.AgentRecord
	if err := json.Unmarshal(recs, &ar); err != nil {
		t.Fatal(err)
	}
	v9 := ar
	v9.Episode = json.RawMessage(strings.Replace(string(ar.Episode), `"v":1`, `"v":9`, 1))
	other := ar
	other.Session.Adapter = "opencode"
	type broken struct {
		files   map[string]string // file name in the participant folder: content
		records []driver.AgentRecord
		words   []string // what the error must name
	}
	manifestPath := func(name string) string {
		return filepath.Join(participantDir(filepath.Join(e.dir, "bad", name)), gym.ManifestName)
	}
	recordsPath := func(name string) string {
		return filepath.Join(participantDir(filepath.Join(e.dir, "bad", name)), recName)
	}
	bad := map[string]broken{
		// The manifest is published last: without it, nothing is there.
		"no-manifest": {files: map[string]string{recName: string(recs)}, words: []string{"missing manifest", manifestPath("no-manifest")}},
		// A commit that died while writing its records left only the
		// temporary file.
		"died-mid-write": {files: map[string]string{".records.jsonl.4242": string(recs[:len(recs)/2])}, words: []string{"missing manifest", manifestPath("died-mid-write")}},
		// The records file is cut in the middle of its line.
		"cut-records": {files: map[string]string{gym.ManifestName: string(man), recName: string(recs[:len(recs)/2])}, words: []string{recordsPath("cut-records"), "line 1"}},
		// One byte changed inside a string: still JSON, not the digest.
		"digest": {files: map[string]string{gym.ManifestName: string(man), recName: strings.Replace(string(recs), `"fake"`, `"faKe"`, 1)},
			words: []string{recordsPath("digest"), "digest"}},
		"schema-9": {files: map[string]string{gym.ManifestName: strings.Replace(string(man), `"schema_version": 1`, `"schema_version": 9`, 1), recName: string(recs)},
			words: []string{manifestPath("schema-9"), "schema 9"}},
		"other-instance": {files: map[string]string{gym.ManifestName: strings.Replace(string(man), `"instance": "`+driverName+`"`, `"instance": "other"`, 1), recName: string(recs)},
			words: []string{manifestPath("other-instance"), "agent/other"}},
		"manifest-not-json": {files: map[string]string{gym.ManifestName: string(man[:len(man)/2]), recName: string(recs)},
			words: []string{manifestPath("manifest-not-json"), "not JSON"}},
		// Well stored, but the run's bookmark is of an unknown version, or
		// another adapter wrote it.
		"bookmark-v9":   {records: []driver.AgentRecord{v9}, words: []string{id, "version 9"}},
		"other-adapter": {records: []driver.AgentRecord{other}, words: []string{id, `"opencode"`}},
	}
	for name, b := range bad {
		t.Run("bad-folder/"+name, func(t *testing.T) {
			dir := filepath.Join(e.dir, "bad", name)
			pdir := participantDir(dir)
			if b.records != nil {
				writeRecords(t, dir, ckID, b.records...)
			} else {
				if err := os.MkdirAll(pdir, 0o755); err != nil {
					t.Fatal(err)
				}
				for f, data := range b.files {
					if err := os.WriteFile(filepath.Join(pdir, f), []byte(data), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := folderState(t, pdir)
			r := c.call(t, "restore", restoreBody(e.prefix+"-restore-"+name, dir, episodes(id)))
			wantRefused(t, r, http.StatusUnprocessableEntity, gym.CodeCheckpointState, b.words...)
			e.wantPhase(t, "idle")
			if after := folderState(t, pdir); after != before {
				t.Errorf("%s: restore changed the checkpoint folder:\n%s\nthen\n%s", name, before, after)
			}
		})
	}
	// A checkpoint_dir that does not exist.
	nowhere := filepath.Join(e.dir, "nowhere")
	t.Run("bad-folder/nowhere", func(t *testing.T) {
		wantRefused(t, c.call(t, "restore", restoreBody(e.prefix+"-restore-nowhere", nowhere, episodes(id))), http.StatusUnprocessableEntity, gym.CodeCheckpointState, nowhere)
	})
	// The owner: a restore from a folder without its records (the
	// driver's alone, or none) is 422 invalid_checkpoint_state naming its
	// missing manifest, and changes nothing.
	for name, dir := range map[string]string{"drivers-alone": filepath.Join(e.dir, "bad", "drivers-alone"), "nowhere": nowhere} {
		t.Run("owner-bad-folder/"+name, func(t *testing.T) {
			if name == "drivers-alone" {
				writeRecords(t, dir, ckID, ar)
			}
			pdir, err := gym.ParticipantDir(dir, gym.KindResources, ownerInstance)
			if err != nil {
				t.Fatal(err)
			}
			r := e.own.call(t, "restore", restoreBody(e.prefix+"-restore-owner", dir, episodes(id)))
			wantRefused(t, r, http.StatusUnprocessableEntity, gym.CodeCheckpointState, filepath.Join(pdir, gym.ManifestName))
			if s := e.own.status(t); s.Phase != gym.PhaseIdle || s.Report.Counts["sessions"] != 0 {
				t.Errorf("owner status after a refused restore from %s: %+v, want idle, no session", dir, s)
			}
		})
	}
	// Nothing was installed by the refused restores above (this subtest
	// comes after them on purpose): the attempt a restore would have
	// installed (attempt 1) starts at seed and is never relaunched.
	t.Run("nothing-installed", func(t *testing.T) {
		e.wantPhase(t, "idle")
		if s := c.status(t); s.Report.Counts["sessions"] != 0 {
			t.Errorf("status after the refused restores: %+v, want no session", s)
		}
		res := postRun(t.Context(), c.url, "/run", id, withAttempt(e.body(id, 3, 0.05), 1)).result(t)
		checkOneLaunchFresh(t, id, 1, res, 3)
		e.wantPhase(t, "idle")
	})

	// The good folder restores under the restore's own checkpoint id:
	// the record of attempt 0 is installed for attempt 1, admission stays
	// closed, and a retire in the restored phase drops it again.
	restoreID := e.prefix + "-restore-good"
	var rr gym.RestoreReply
	c.must(t, "restore", restoreBody(restoreID, ckDir, episodes(id)), &rr)
	t.Run("restored", func(t *testing.T) {
		if rr.Phase != gym.PhaseRestored || rr.SourceCheckpointID != ckID || !slices.Equal(rr.Restored, []string{id + "-a1"}) {
			t.Errorf("restore answered %+v, want restored from %s: [%s-a1]", rr, ckID, id)
		}
		if s := c.status(t); s.Phase != gym.PhaseRestored || s.CheckpointID == nil || *s.CheckpointID != restoreID || s.Report.Counts["sessions"] != 1 {
			t.Errorf("status after the restore: %+v, want restored under %s with 1 session", s, restoreID)
		}
		runRefused(t, postRun(t.Context(), c.url, "/run", late, e.body(late, 2, 0.05)), http.StatusConflict, gym.CodeCheckpointParked, late)
	})
	var ret gym.RetireReply
	c.must(t, "retire", map[string]any{"checkpoint_id": restoreID, "deadline_ts": deadline(waitLimit),
		"episode_ids": []gym.EpisodeID{{RolloutID: id, Attempt: 1}}}, &ret)
	t.Run("retired", func(t *testing.T) {
		if s := c.status(t); s.Report.Counts["sessions"] != 0 || s.RetiredRollouts != 1 {
			t.Errorf("status after retiring the restored attempt: %+v, want no session, 1 retired rollout", s)
		}
	})
	e.resume(restoreID)
	t.Run("new-run-after-resume", func(t *testing.T) {
		res := postRun(t.Context(), c.url, "/run", late, e.body(late, 2, 0.05)).result(t)
		checkOneLaunchFresh(t, late, 0, res, 2)
	})
}

// folderState lists a folder's files with their sizes and digests.
func folderState(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, ent := range ents {
		data, _ := os.ReadFile(filepath.Join(dir, ent.Name()))
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "%s %d %x\n", ent.Name(), len(data), sum[:6])
	}
	return b.String()
}

// checkOneLaunchFresh checks a run that started at seed as the attempt.
func checkOneLaunchFresh(t *testing.T, id string, attempt int, res result, steps int) {
	t.Helper()
	if res.Reward != 1 || len(res.Launches) != 1 || res.Fake.FirstStep != 1 || res.Fake.Steps != steps {
		t.Errorf("%s: %+v, want a fresh run: reward 1, one launch, steps 1..%d", id, res, steps)
		return
	}
	if l := res.Launches[0]; l.ID != driver.LaunchID(id, attempt, 1, l.SandboxID) || l.Resumed || l.Reason != "first launch" {
		t.Errorf("%s: launch %+v, want %s, a first launch", id, l, driver.LaunchID(id, attempt, 1, l.SandboxID))
	}
}

// TestClientGone: a client that goes away mid-run cancels it: the driver
// kills the launch (every process of it, the detached ones too), closes the
// owner's session, and forgets the run; the next attempt of the rollout
// (as Gym's collector re-issues one) starts over. The owner binds a
// session to its attempt's capture key, so the same attempt again is
// refused: its session ended.
func TestClientGone(t *testing.T) {
	e := newEnv(t, options{})
	id := e.rollout("gone")
	ctx, cancel := context.WithCancel(t.Context())
	ch := make(chan runReply, 1)
	go func() { ch <- postRun(ctx, e.ctl.url, "/run", id, e.body(id, 100, 0.3)) }()
	e.waitStepped(id)
	if live := e.liveHarnesses(); len(live) != 1 {
		t.Fatalf("live harnesses %v, want the run's", live)
	}
	cancel()
	if r := <-ch; r.err == nil {
		t.Fatalf("the cancelled request got a reply: %s", r)
	}
	testkit.Eventually(t, "the cancelled run's launch is killed and the run forgotten", func() (bool, string) {
		left := e.leftovers()
		h := e.health()
		return len(left) == 0 && h.Runs == 0, fmt.Sprintf("processes %v, runs %d", left, h.Runs)
	})
	if r := postRun(t.Context(), e.ctl.url, "/run", id, e.body(id, 3, 0.05)); r.err != nil || r.status == http.StatusOK {
		t.Errorf("the cancelled attempt again: %s, want a refusal (the owner ended its session)", r)
	}
	res := postRun(t.Context(), e.ctl.url, "/run", id, withAttempt(e.body(id, 3, 0.05), 1)).result(t)
	checkOneLaunchFresh(t, id, 1, res, 3)
}

// TestRunIdentity: /run takes its identity as Gym's collector and
// resources servers give it. _ng_rollout_id wins over _ng_task_index and
// _ng_rollout_index, which otherwise make the rollout id
// "<task>-<rollout>"; _ng_attempt_index is the attempt (default 0). With
// no identity in the body the path /ng-rollout/<capture key>/run names
// it (<id> is attempt 0, <id>-a<N> attempt N); a path and a body that
// both name one must agree (422 invalid_request otherwise). A malformed
// _ng_rollout_id (one ending with the reserved -a<N>, or not a string) or
// capture key is refused with 422, never rewritten into another attempt,
// and starts nothing.
func TestRunIdentity(t *testing.T) {
	e := newEnv(t, options{})
	only := func(fields map[string]any) map[string]any {
		b := e.body("", 2, 0.05)
		delete(b, "_ng_rollout_id")
		for k, v := range fields {
			b[k] = v
		}
		return b
	}
	cases := []struct {
		path    string
		body    map[string]any
		rollout string
		attempt int
	}{
		{"/ng-rollout/" + e.rollout("y") + "-a2/run", only(nil), e.rollout("y"), 2},
		{"/ng-rollout/" + e.rollout("z") + "/run", only(map[string]any{"_ng_rollout_id": e.rollout("z")}), e.rollout("z"), 0},
		{"/ng-rollout/" + e.rollout("w") + "-a3/run", only(map[string]any{"_ng_rollout_id": e.rollout("w"), "_ng_attempt_index": 3}), e.rollout("w"), 3},
		{"/run", only(map[string]any{"_ng_rollout_id": e.rollout("v"), "_ng_task_index": 4, "_ng_rollout_index": 1}), e.rollout("v"), 0},
		{"/run", only(map[string]any{"_ng_task_index": e.rollout("t"), "_ng_rollout_index": 5, "_ng_attempt_index": "2"}), e.rollout("t") + "-5", 2},
	}
	chans := make([]<-chan runReply, len(cases))
	for i, c := range cases {
		chans[i] = e.startRun(c.path, c.rollout, c.body)
	}
	for i, c := range cases {
		res := await(t, chans[i]).result(t)
		if len(res.Launches) != 1 {
			t.Errorf("POST %s (body %v): launches %+v; want one", c.path, c.body, res.Launches)
			continue
		}
		want := driver.LaunchID(c.rollout, c.attempt, 1, res.Launches[0].SandboxID)
		if res.Reward != 1 || res.Launches[0].ID != want {
			t.Errorf("POST %s (body %v): reward %v, launches %+v; want one launch %s", c.path, c.body, res.Reward, res.Launches, want)
		}
	}
	x := e.rollout("x")
	refused := []struct {
		path string
		body map[string]any
		name []string
	}{
		// Path and body disagree: on the attempt, on the rollout.
		{"/ng-rollout/" + x + "-a2/run", only(map[string]any{"_ng_rollout_id": x}), []string{x + "-a2", x}},
		{"/ng-rollout/" + x + "/run", only(map[string]any{"_ng_rollout_id": e.rollout("other")}), []string{x, e.rollout("other")}},
		{"/ng-rollout/" + x + "-a1/run", only(map[string]any{"_ng_task_index": 1, "_ng_rollout_index": 2, "_ng_attempt_index": 1}), []string{x + "-a1", "1-2-a1"}},
		// A malformed _ng_rollout_id, with or without a path.
		{"/run", only(map[string]any{"_ng_rollout_id": x + "-a7"}), []string{x + "-a7"}},
		{"/ng-rollout/" + x + "-a7/run", only(map[string]any{"_ng_rollout_id": x + "-a7"}), []string{x + "-a7"}},
		{"/run", only(map[string]any{"_ng_rollout_id": 7}), []string{gym.FieldRolloutID}},
		{"/run", only(map[string]any{"_ng_rollout_id": x, "_ng_attempt_index": -1}), []string{gym.FieldAttemptIndex}},
		// A capture key whose rollout id ends with the reserved suffix.
		{"/ng-rollout/" + x + "-a1-a2/run", only(nil), []string{x + "-a1-a2"}},
	}
	for _, c := range refused {
		runRefused(t, postRun(t.Context(), e.ctl.url, c.path, c.path, c.body), http.StatusUnprocessableEntity, gym.CodeInvalidRequest, c.name...)
	}
	if h := e.health(); h.Runs != 0 {
		t.Errorf("refused runs were registered: %d runs", h.Runs)
	}
	if files, _ := filepath.Glob(filepath.Join(e.base, "sandboxes", "*", ".ngharness", "state", "fake", x+"*")); len(files) != 0 {
		t.Errorf("a refused run of %s started a session: %v", x, files)
	}
}
