package model

// The fake model as NeMo Gym's policy model participant, over real HTTP on
// loopback. The cases port those of Gym's tests/unit_tests/
// test_checkpoint_model.py (NVIDIA-NeMo/Gym, the version stored beside
// model.py b58bb4f) that apply to a model without generation cuts, with
// b58bb4f's gate: a new call while admission is closed waits for the
// resume instead of being refused.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/gym"
)

const modelToken = "model-token"

// startModel starts a fake model taking part in checkpoints as "policy".
func startModel(t *testing.T, opt Options) *Server {
	t.Helper()
	opt.Checkpoint = &Checkpoint{Token: modelToken, Instance: "policy", LeaseGrace: time.Minute}
	return start(t, opt)
}

// control sends one control call (GET status when body is nil) with auth
// ("" sends none) and returns the status and the reply's fields.
func control(t *testing.T, s *Server, op string, body any, auth string) (int, map[string]json.RawMessage) {
	t.Helper()
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		data, _ := json.Marshal(body)
		method, rd = http.MethodPost, bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, s.URL()+gym.RoutePrefix+"/"+op, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	var f map[string]json.RawMessage
	json.Unmarshal(data, &f)
	return res.StatusCode, f
}

// ok is a control call with the token that must answer 200.
func ok(t *testing.T, s *Server, op string, body any) map[string]json.RawMessage {
	t.Helper()
	status, f := control(t, s, op, body, "Bearer "+modelToken)
	if status != http.StatusOK {
		t.Fatalf("%s: HTTP %d %v", op, status, f)
	}
	return f
}

// refused is a control call with the token that must be refused with code.
func refused(t *testing.T, s *Server, op string, body any, status int, code string) string {
	t.Helper()
	got, f := control(t, s, op, body, "Bearer "+modelToken)
	var e gym.ErrorBody
	json.Unmarshal([]byte(mustJSON(t, f)), &e)
	if got != status || e.Error.Code != code {
		t.Fatalf("%s: HTTP %d %v, want %d %s", op, got, f, status, code)
	}
	return e.Error.Detail
}

// ck is a control body of checkpoint id with extra fields.
func ck(id string, extra map[string]any) map[string]any {
	b := map[string]any{"checkpoint_id": id, "deadline_ts": float64(time.Now().Add(waitLimit).UnixNano()) / 1e9}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// scope is a list of episode ids of attempt 0.
func scope(rollouts ...string) []map[string]any {
	out := []map[string]any{}
	for _, r := range rollouts {
		out = append(out, map[string]any{"rollout_id": r, "attempt": 0})
	}
	return out
}

// report reads a reply's report.
func report(t *testing.T, f map[string]json.RawMessage) gym.Report {
	t.Helper()
	var r gym.Report
	if err := json.Unmarshal(f["report"], &r); err != nil {
		t.Fatalf("report %s: %v", f["report"], err)
	}
	return r
}

func str(raw json.RawMessage) string {
	var s string
	json.Unmarshal(raw, &s)
	return s
}

// waiting is how many calls or responses wait for the resume.
func (s *Server) waitingCalls() int {
	s.policy.mu.Lock()
	defer s.policy.mu.Unlock()
	return s.policy.waiting
}

// generate posts a chat completion of key in the background.
func generate(s *Server, key string) <-chan fetched {
	ch := make(chan fetched, 1)
	go func() {
		ch <- fetch(s.URL()+"/ng-rollout/"+key+"/v1/chat/completions", chatBody(false, false, false, user("hi")))
	}()
	return ch
}

// answered waits for a background call's reply.
func answered(t *testing.T, ch <-chan fetched) fetched {
	t.Helper()
	select {
	case f := <-ch:
		return f
	case <-time.After(waitLimit):
		t.Fatal("a model call got no reply")
		return fetched{}
	}
}

// TestModelParticipantIsOptIn: without Options.Checkpoint the control
// routes answer 404 (Gym's discover: not a participant); with it, status
// needs the bearer token and names kind model, the instance, phase idle
// with null checkpoint and lease, a ready report with Gym's model counts,
// and the restored generation cuts (none).
func TestModelParticipantIsOptIn(t *testing.T) {
	plain := start(t, Options{})
	if status, _ := control(t, plain, gym.OpStatus, nil, "Bearer "+modelToken); status != http.StatusNotFound {
		t.Errorf("a fake model without Checkpoint: status HTTP %d, want 404", status)
	}
	s := startModel(t, Options{})
	for _, auth := range []string{"", "Bearer wrong", modelToken} {
		if status, _ := control(t, s, gym.OpStatus, nil, auth); status != http.StatusUnauthorized {
			t.Errorf("status with Authorization %q: HTTP %d, want 401", auth, status)
		}
	}
	f := ok(t, s, gym.OpStatus, nil)
	r := report(t, f)
	if str(f["kind"]) != gym.KindModel || str(f["instance"]) != "policy" || str(f["phase"]) != "idle" ||
		string(f["checkpoint_id"]) != "null" || string(f["lease_expires_at"]) != "null" || string(f["restored_generation_cuts"]) != "[]" ||
		!r.Ready || len(r.Counts) != 5 || r.Counts["inflight"] != 0 {
		t.Errorf("idle status %v", f)
	}
	if s.opt.Checkpoint.Instance != "policy" || New(Options{Checkpoint: &Checkpoint{}}).Start() == nil {
		t.Errorf("a Checkpoint without a token was accepted")
	}
}

// TestModelStreamingResponseBlocksPrepareAndNewCallsWait ports
// test_started_stream_drains_before_prepare_is_ready_and_new_calls_are_parked:
// a response that has started streaming blocks the prepare (its capture
// key the blocker, the prepare answering "preparing" at its deadline); a
// new call while admission is closed waits, and is answered after the
// resume; with the stream gone the next prepare is ready.
func TestModelStreamingResponseBlocksPrepareAndNewCallsWait(t *testing.T) {
	s := startModel(t, Options{Script: func(r Request) Reply {
		if strings.HasPrefix(r.Path, "/ng-rollout/r-a1/") {
			return Reply{Text: "a long answer streamed slowly", Pace: time.Hour}
		}
		return Reply{Text: "later"}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err := post(ctx, s.URL()+"/ng-rollout/r-a1/v1/chat/completions", chatBody(true, false, false, user("go")))
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 5)
	if _, err := io.ReadFull(res.Body, first); err != nil || string(first) != "data:" {
		t.Fatalf("the stream did not start: %q %v", first, err)
	}
	short := ck("c1", nil)
	short["deadline_ts"] = float64(time.Now().Add(time.Second).UnixNano()) / 1e9
	f := ok(t, s, gym.OpPrepare, short)
	if r := report(t, f); str(f["phase"]) != "preparing" || r.Ready || strings.Join(r.Blockers, ",") != "r-a1" {
		t.Errorf("prepare with a stream started: %v, want preparing, blocked by r-a1", f)
	}
	later := generate(s, "other")
	testkit.Eventually(t, "the new call waits for the resume", func() (bool, string) { return s.waitingCalls() == 1, "" })
	cancel()
	res.Body.Close()
	testkit.Eventually(t, "the stream ended", func() (bool, string) { return report(t, ok(t, s, gym.OpStatus, nil)).Counts["inflight"] == 0, "" })
	ok(t, s, gym.OpResume, ck("c1", nil))
	if got := answered(t, later); got.err != nil || got.res.StatusCode != http.StatusOK {
		t.Errorf("the call that waited: %+v", got)
	}
	if f := ok(t, s, gym.OpPrepare, ck("c2", nil)); str(f["phase"]) != "prepared" {
		t.Errorf("prepare with nothing streaming: %v", f)
	}
	ok(t, s, gym.OpResume, ck("c2", nil))
}

// TestModelUndeliveredResponseIsHeldAndLeftOut ports
// test_undelivered_generation_does_not_block_prepare_and_is_held_until_resume
// and the undelivered rows' exclusion: a call admitted before the prepare
// does not block it (counted held), its response waits for the resume, and
// a commit meanwhile leaves the call out (no record: the restored agent
// sends it again). Once delivered, the next checkpoint holds its ledger
// row, and the commit reply names no staging key.
func TestModelUndeliveredResponseIsHeldAndLeftOut(t *testing.T) {
	s := startModel(t, Options{})
	s.Hold(1)
	call := generate(s, "r")
	testkit.Eventually(t, "the call held before its reply", func() (bool, string) { return s.Held() == 1, "" })
	f := ok(t, s, gym.OpPrepare, ck("c1", nil))
	if r := report(t, f); str(f["phase"]) != "prepared" || r.Counts["held"] != 1 || r.Counts["inflight"] != 1 {
		t.Errorf("prepare with an undelivered call: %v", f)
	}
	s.Release()
	testkit.Eventually(t, "the reply held for the resume", func() (bool, string) { return s.waitingCalls() == 1, "" })
	dir := t.TempDir()
	c := ok(t, s, gym.OpCommit, ck("c1", map[string]any{"checkpoint_dir": dir, "episode_ids": scope("r")}))
	if string(c["episode_ids"]) != "[]" || !strings.Contains(string(c["manifest"]), `"record_count":0`) {
		t.Errorf("commit with the call undelivered: %v", c)
	}
	ok(t, s, gym.OpResume, ck("c1", nil))
	if got := answered(t, call); got.err != nil || got.res.StatusCode != http.StatusOK {
		t.Fatalf("the held call after the resume: %+v", got)
	}
	ok(t, s, gym.OpPrepare, ck("c2", nil))
	c = ok(t, s, gym.OpCommit, ck("c2", map[string]any{"checkpoint_dir": filepath.Join(dir, "2"), "episode_ids": scope("r", "s")}))
	if string(c["episode_ids"]) != `["r"]` || string(c["staging_keys"]) != "[]" || string(c["staging_keys_by_episode"]) != `{"r":[]}` {
		t.Errorf("commit with the call delivered: %v", c)
	}
	ok(t, s, gym.OpResume, ck("c2", nil))
	records, _ := os.ReadFile(filepath.Join(dir, "2", "gym", "model", "policy", str(mustField(t, c["manifest"], "records_file"))))
	if !bytes.HasPrefix(records, []byte(`{"episode_id":{"rollout_id":"r","attempt":0},"rows":[{"model_call_id":"fakemodel-1"}],"generation_cuts":[]}`)) {
		t.Errorf("the record: %s", records)
	}
}

func mustField(t *testing.T, raw json.RawMessage, name string) json.RawMessage {
	t.Helper()
	var f map[string]json.RawMessage
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return f[name]
}

// TestModelRetireCancelsACallAndFencesItsAttempt ports
// test_retire_cancels_a_held_generation_and_fences_its_attempt (while
// idle: 011c338's retire is refused while a checkpoint is open): the call
// in flight is cut off, the retire answers once it has ended, a later call
// of the attempt (or an earlier one) is refused 409 stale_attempt, a call
// of the next attempt is not, and forget lifts the mark.
func TestModelRetireCancelsACallAndFencesItsAttempt(t *testing.T) {
	s := startModel(t, Options{})
	s.Hold(1)
	call := generate(s, "r-a1")
	testkit.Eventually(t, "the call held", func() (bool, string) { return s.Held() == 1, "" })
	f := ok(t, s, gym.OpRetire, ck("x", map[string]any{"episode_ids": []map[string]any{{"rollout_id": "r", "attempt": 1}}}))
	if string(f["retired"]) != `["r-a1"]` {
		t.Errorf("retire: %v", f)
	}
	if got := answered(t, call); got.err == nil && got.res.StatusCode == http.StatusOK {
		t.Errorf("the retired call was answered: %+v", got.res)
	}
	if r := report(t, ok(t, s, gym.OpStatus, nil)); r.Counts["inflight"] != 0 {
		t.Errorf("inflight %d after the retire", r.Counts["inflight"])
	}
	for _, key := range []string{"r-a1", "r"} {
		got := answered(t, generate(s, key))
		var e gym.ErrorBody
		json.NewDecoder(got.res.Body).Decode(&e)
		if got.res.StatusCode != http.StatusConflict || e.Error.Code != gym.CodeStaleAttempt {
			t.Errorf("a call of retired %s: HTTP %d %+v, want 409 stale_attempt", key, got.res.StatusCode, e)
		}
	}
	if got := answered(t, generate(s, "r-a2")); got.res.StatusCode != http.StatusOK {
		t.Errorf("a call of the next attempt: HTTP %d", got.res.StatusCode)
	}
	if got := answered(t, generate(s, "bad-a1-a2")); got.res.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("a call whose prefix is no capture key: HTTP %d, want 422", got.res.StatusCode)
	}
	ok(t, s, gym.OpForget, ck("x", map[string]any{"rollout_ids": []string{"r"}}))
	if got := answered(t, generate(s, "r-a1")); got.res.StatusCode != http.StatusOK {
		t.Errorf("a call after forget: HTTP %d", got.res.StatusCode)
	}
}

// TestModelCommitNeedsTheScope ports
// test_model_commit_requires_the_continued_episodes: a commit without
// episode_ids is refused (409 checkpoint_error naming them).
func TestModelCommitNeedsTheScope(t *testing.T) {
	s := startModel(t, Options{})
	ok(t, s, gym.OpPrepare, ck("c1", nil))
	if d := refused(t, s, gym.OpCommit, ck("c1", map[string]any{"checkpoint_dir": t.TempDir()}), http.StatusConflict, gym.CodeRefused); !strings.Contains(d, "episode_ids") {
		t.Errorf("detail %q", d)
	}
}

// TestModelRestore ports test_restored_ledger_lets_the_next_attempt_resolve_its_parent
// as far as the fake's ledger goes: a fresh server restores the records
// of the scope under the next attempt (restored [r-a1]; s had no row and
// gets none), and a checkpoint before the replacement's first call
// exports them again as that attempt's; a server that has served calls
// refuses a restore (409 checkpoint_error); a record with a field Gym's
// ModelRecord forbids is refused (422 invalid_checkpoint_state) and
// nothing is installed.
func TestModelRestore(t *testing.T) {
	a := startModel(t, Options{})
	if got := answered(t, generate(a, "r")); got.res.StatusCode != http.StatusOK {
		t.Fatalf("call: HTTP %d", got.res.StatusCode)
	}
	dir := t.TempDir()
	ok(t, a, gym.OpPrepare, ck("c1", nil))
	ok(t, a, gym.OpCommit, ck("c1", map[string]any{"checkpoint_dir": dir, "episode_ids": scope("r", "s")}))
	ok(t, a, gym.OpResume, ck("c1", nil))
	if d := refused(t, a, gym.OpRestore, ck("r0", map[string]any{"checkpoint_dir": dir, "episode_ids": scope("r")}), http.StatusConflict, gym.CodeRefused); !strings.Contains(d, "freshly started") {
		t.Errorf("a restore into a server that served calls: %q", d)
	}

	b := startModel(t, Options{})
	f := ok(t, b, gym.OpRestore, ck("r1", map[string]any{"checkpoint_dir": dir, "episode_ids": scope("r", "s")}))
	if string(f["restored"]) != `["r-a1"]` || str(f["source_checkpoint_id"]) != "c1" {
		t.Errorf("restore: %v", f)
	}
	ok(t, b, gym.OpResume, ck("r1", nil))
	ok(t, b, gym.OpPrepare, ck("c2", nil))
	next := []map[string]any{{"rollout_id": "r", "attempt": 1}, {"rollout_id": "s", "attempt": 1}}
	c := ok(t, b, gym.OpCommit, ck("c2", map[string]any{"checkpoint_dir": filepath.Join(dir, "2"), "episode_ids": next}))
	if string(c["episode_ids"]) != `["r-a1"]` {
		t.Errorf("the restored rows were not exported again as r-a1's: %v", c)
	}
	ok(t, b, gym.OpResume, ck("c2", nil))

	bad := filepath.Join(dir, "bad")
	rec, _ := gym.NewRecord(map[string]any{"episode_id": map[string]any{"rollout_id": "r", "attempt": 0}, "rows": []any{}, "generation_cuts": []any{}, "extra": 1})
	if _, err := gym.WriteState(bad, gym.KindModel, "policy", "c3", []gym.Record{rec}, nil, nil); err != nil {
		t.Fatal(err)
	}
	fresh := startModel(t, Options{})
	refused(t, fresh, gym.OpRestore, ck("r3", map[string]any{"checkpoint_dir": bad, "episode_ids": scope("r")}), http.StatusUnprocessableEntity, gym.CodeCheckpointState)
	if st := ok(t, fresh, gym.OpStatus, nil); str(st["phase"]) != "idle" || len(fresh.policy.restoredTargets) != 0 {
		t.Errorf("a refused restore left %v", st)
	}
}
