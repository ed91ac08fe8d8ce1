package gym

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// Ports test_control_request_rejects_invalid_identity_and_deadline
// (test_checkpoint_control.py) and the request models of control.py
// 011c338: every field's rule, unknown fields refused, at every level.
func TestDecodeRequestRefuses(t *testing.T) {
	long := strings.Repeat("c", MaxCheckpointIDLen+1)
	for _, tc := range []struct{ op, body string }{
		{OpPrepare, `{"checkpoint_id":"../bad","deadline_ts":1000}`},
		{OpPrepare, `{"checkpoint_id":"ckpt-1","deadline_ts":1e400}`},
		{OpPrepare, `{"checkpoint_id":"ckpt-1","deadline_ts":"soon"}`},
		{OpPrepare, `{"checkpoint_id":"ckpt-1","deadline_ts":null}`},
		{OpPrepare, `{"checkpoint_id":"ckpt-1","deadline_ts":true}`},
		{OpPrepare, `{"checkpoint_id":"ckpt-1"}`},
		{OpPrepare, `{"deadline_ts":1}`},
		{OpPrepare, `{"checkpoint_id":"","deadline_ts":1}`},
		{OpPrepare, `{"checkpoint_id":"` + long + `","deadline_ts":1}`},
		{OpPrepare, `{"checkpoint_id":".c","deadline_ts":1}`},
		{OpPrepare, `{"checkpoint_id":7,"deadline_ts":1}`},
		{OpPrepare, `{"checkpoint_id":"c","deadline_ts":1,"stop":true}`},
		{OpPrepare, `{"Checkpoint_ID":"c","deadline_ts":1}`},
		{OpPrepare, `{"checkpoint_id":"c","deadline_ts":1} {}`},
		{OpPrepare, `[]`},
		{OpPrepare, ``},
		{OpResume, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x"}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":""}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","stop":"yes"}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","stop":null}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","episode_ids":["r"]}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","episode_ids":[{"rollout_id":"r","x":1}]}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","episode_ids":[{"rollout_id":"r-a1"}]}`},
		{OpRestore, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x"}`},
		{OpRestore, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","episode_ids":null}`},
		{OpRestore, `{"checkpoint_id":"c","deadline_ts":1,"episode_ids":[]}`},
		{OpRetire, `{"checkpoint_id":"c","deadline_ts":1,"episode_ids":[]}`},
		{OpRetire, `{"checkpoint_id":"c","deadline_ts":1}`},
		{OpRetire, `{"checkpoint_id":"c","deadline_ts":1,"episode_ids":[{"attempt":1}]}`},
		{OpForget, `{"checkpoint_id":"c","deadline_ts":1,"rollout_ids":[]}`},
		{OpForget, `{"checkpoint_id":"c","deadline_ts":1,"rollout_ids":[1]}`},
		{OpForget, `{"checkpoint_id":"c","deadline_ts":1,"episode_ids":[{"rollout_id":"r"}]}`},
		{OpStatus, `{}`},
	} {
		got, err := DecodeRequest(tc.op, []byte(tc.body))
		if err == nil {
			t.Errorf("%s %s -> %+v, want refused", tc.op, tc.body, got)
			continue
		}
		wantCode(t, err, CodeInvalidRequest)
	}
}

// What the models take: defaults (stop false, episode_ids None), an
// explicit null scope, an empty restore scope, any strings to forget.
func TestDecodeRequestAccepts(t *testing.T) {
	for _, tc := range []struct{ op, body, want string }{
		{OpPrepare, `{"checkpoint_id":"ckpt-1","deadline_ts":1764583200.5}`, `&{ckpt-1 1.7645832005e+09}`},
		{OpPrepare, `{"checkpoint_id":"c","deadline_ts":"1000"}`, `&{c 1000}`},
		{OpRenew, `{"checkpoint_id":"` + strings.Repeat("c", 128) + `","deadline_ts":1}`, `&{` + strings.Repeat("c", 128) + ` 1}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x"}`, `&{{c 1} /x [] false}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","episode_ids":null,"stop":true}`, `&{{c 1} /x [] true}`},
		{OpCommit, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","episode_ids":[{"rollout_id":"r","attempt":1}]}`, `&{{c 1} /x [r-a1] false}`},
		{OpRestore, `{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","episode_ids":[]}`, `&{{c 1} /x []}`},
		{OpRetire, `{"checkpoint_id":"retire","deadline_ts":1,"episode_ids":[{"rollout_id":"r"}]}`, `&{{retire 1} [r]}`},
		{OpForget, `{"checkpoint_id":"c","deadline_ts":1,"rollout_ids":["r","not/checked"]}`, `&{{c 1} [r not/checked]}`},
	} {
		got, err := DecodeRequest(tc.op, []byte(tc.body))
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("%s %s -> %v, %v; want %s", tc.op, tc.body, got, err, tc.want)
		}
	}
	commit := must(DecodeRequest(OpCommit, []byte(`{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x"}`))).(*CommitRequest)
	empty := must(DecodeRequest(OpCommit, []byte(`{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/x","episode_ids":[]}`))).(*CommitRequest)
	if commit.EpisodeIDs != nil || empty.EpisodeIDs == nil {
		t.Fatal("a missing scope (everything) and an empty one (nothing) must differ")
	}
}

// The replies' JSON, field for field as control.py builds them.
func TestReplyShapes(t *testing.T) {
	m := Manifest{SchemaVersion: 1, Kind: "agent", Instance: "i", CheckpointID: "c", RecordsFile: "records-x.jsonl", RecordsSHA256: "x", RecordCount: 0, Extra: map[string]any{"boundary_format": 2}}
	for _, tc := range []struct {
		v    any
		want string
	}{
		{PrepareReply{Phase: PhasePreparing, Report: NewReport(false, []string{"r"}, nil, nil)},
			`{"phase":"preparing","report":{"ready":false,"blockers":["r"],"blocker_count":1,"counts":{},"restarts":[]}}`},
		{RenewReply{LeaseExpiresAt: 1764583200.25}, `{"lease_expires_at":1764583200.25}`},
		{RetireReply{Retired: []string{"r-a1"}}, `{"retired":["r-a1"]}`},
		{ForgetReply{Forgotten: []string{"r"}}, `{"forgotten":["r"]}`},
		{CommitReply{Phase: PhaseCommitted, Manifest: m, Extra: map[string]any{"sessions": 3}},
			`{"episode_ids":[],"manifest":{"boundary_format":2,"checkpoint_id":"c","instance":"i","kind":"agent","record_count":0,"records_file":"records-x.jsonl","records_sha256":"x","schema_version":1},"phase":"committed","sessions":3}`},
		{RestoreReply{Phase: PhaseRestored, SourceCheckpointID: "c1", Restored: []string{"r-a2"}}, `{"phase":"restored","source_checkpoint_id":"c1","restored":["r-a2"]}`},
		{ResumeReply{Phase: PhaseIdle, Idempotent: true}, `{"phase":"idle","idempotent":true}`},
	} {
		got, err := json.Marshal(tc.v)
		if err != nil || string(got) != tc.want {
			t.Errorf("%T = %s, %v\nwant %s", tc.v, got, err, tc.want)
		}
	}
}
