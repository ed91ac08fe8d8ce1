package e2e

// The test controller: the checkpoint control plane spoken as NeMo Gym's
// coordinator speaks it (docs/gym.md, "The checkpoint routes"), to its two
// participants: the driver (kind agent) and the owner (kind resources).
// POST /ng-control/v1/checkpoint/<call> with Authorization: Bearer; every
// body has checkpoint_id and deadline_ts, commit adds checkpoint_dir,
// episode_ids (the optional scope) and stop, restore adds checkpoint_dir
// and episode_ids. As Gym's coordinator, it prepares the agent before the
// resources, commits both into one checkpoint_dir with one scope, and
// restores both from it. The records are pkg/gym's store:
// <checkpoint_dir>/gym/<kind>/<instance>/manifest.json and the
// records-<sha256>.jsonl it publishes: one driver.AgentRecord a line under
// gym/agent/<name>, one lending.Record a line under
// gym/resources/ngdriver_owner.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/gym"
)

// controller calls one participant's control plane.
type controller struct {
	name  string // "driver" or "owner", for messages
	url   string
	token string
}

// ctlReply is a control call's answer.
type ctlReply struct {
	call   string
	status int
	body   []byte
}

func (r ctlReply) String() string {
	return fmt.Sprintf("%s: HTTP %d %s", r.call, r.status, bytes.TrimSpace(r.body))
}

// errorCode and errorText read a refusal in any of the shapes it comes
// in: Gym's envelope {"error": {"code", "detail"}} (every refusal of both
// servers but one); FastAPI's 422 {"detail": [{"msg"}]} for a control body
// that fails validation (code invalid_request, as the driver's own /run
// refusal of one names it); and a bare {"error": "text"} (no code), which
// neither server answers any more but a peer might.
func (r ctlReply) errorCode() string { code, _ := refusal(r.body); return code }
func (r ctlReply) errorText() string { _, text := refusal(r.body); return text }

func refusal(body []byte) (code, text string) {
	var env struct {
		Error  json.RawMessage `json:"error"`
		Detail json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &env) != nil {
		return "", ""
	}
	var inner gym.ErrorDetail
	if json.Unmarshal(env.Error, &inner) == nil && inner.Code != "" {
		return inner.Code, inner.Detail
	}
	var plain string
	if json.Unmarshal(env.Error, &plain) == nil {
		return "", plain
	}
	var issues []gym.ValidationIssue
	if json.Unmarshal(env.Detail, &issues) == nil && len(issues) > 0 {
		var msgs []string
		for _, is := range issues {
			msgs = append(msgs, is.Msg)
		}
		return gym.CodeInvalidRequest, strings.Join(msgs, "; ")
	}
	return "", ""
}

// wantRefused checks a reply is status with Gym's code (unless code is
// "", for a refusal without one) and an error naming every one of words.
func wantRefused(t *testing.T, r ctlReply, status int, code string, words ...string) {
	t.Helper()
	if r.status != status || code != "" && r.errorCode() != code {
		t.Errorf("%s, want %d %s", r, status, code)
		return
	}
	msg := r.errorText()
	if msg == "" {
		t.Errorf("%s: no error text", r)
	}
	for _, w := range words {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: the error does not name %q", r, w)
		}
	}
}

// raw posts body (any JSON value, or a string sent as is) to the call with
// the given Authorization header ("" sends none).
func (c *controller) raw(t *testing.T, call, auth string, body any) ctlReply {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	default:
		data, _ = json.Marshal(b)
	}
	req, err := http.NewRequest(http.MethodPost, c.url+gym.RoutePrefix+"/"+call, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return c.do(t, call, req)
}

func (c *controller) do(t *testing.T, call string, req *http.Request) ctlReply {
	t.Helper()
	client := &http.Client{Timeout: waitLimit}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", c.name, call, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return ctlReply{call: c.name + " " + call, status: resp.StatusCode, body: out}
}

// call posts body with the right token.
func (c *controller) call(t *testing.T, call string, body any) ctlReply {
	t.Helper()
	return c.raw(t, call, "Bearer "+c.token, body)
}

// must posts body and fails the test unless the answer is 200.
func (c *controller) must(t *testing.T, call string, body any, out any) {
	t.Helper()
	r := c.call(t, call, body)
	if r.status != http.StatusOK {
		t.Fatalf("%s", r)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			t.Fatalf("%s: %v", r, err)
		}
	}
}

// rawStatus is GET status with the given Authorization header ("" sends
// none).
func (c *controller) rawStatus(t *testing.T, auth string) ctlReply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.url+gym.RoutePrefix+"/"+gym.OpStatus, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return c.do(t, gym.OpStatus, req)
}

// status is GET status, with the token.
func (c *controller) status(t *testing.T) gym.StatusReply {
	t.Helper()
	r := c.rawStatus(t, "Bearer "+c.token)
	var s gym.StatusReply
	if r.status != http.StatusOK || json.Unmarshal(r.body, &s) != nil {
		t.Fatalf("%s", r)
	}
	return s
}

func deadline(d time.Duration) float64 {
	return float64(time.Now().Add(d).UnixNano()) / 1e9
}

// plainBody is {checkpoint_id, deadline_ts}.
func plainBody(id string) map[string]any {
	return map[string]any{"checkpoint_id": id, "deadline_ts": deadline(waitLimit)}
}

// commitBody is the commit's body; a nil scope leaves episode_ids out
// (every episode).
func commitBody(id, dir string, scope []gym.EpisodeID, stop bool) map[string]any {
	b := map[string]any{"checkpoint_id": id, "deadline_ts": deadline(waitLimit), "checkpoint_dir": dir, "stop": stop}
	if scope != nil {
		b["episode_ids"] = scope
	}
	return b
}

// restoreBody is the restore's body.
func restoreBody(id, dir string, scope []gym.EpisodeID) map[string]any {
	if scope == nil {
		scope = []gym.EpisodeID{}
	}
	return map[string]any{"checkpoint_id": id, "deadline_ts": deadline(waitLimit), "checkpoint_dir": dir, "episode_ids": scope}
}

// episodes are attempt 0 of each rollout.
func episodes(rollouts ...string) []gym.EpisodeID {
	out := make([]gym.EpisodeID, len(rollouts))
	for i, r := range rollouts {
		out[i] = gym.EpisodeID{RolloutID: r}
	}
	return out
}

// prepared is the driver's answer to prepare.
type prepared struct {
	Phase  gym.Phase  `json:"phase"`
	Report gym.Report `json:"report"`
}

// committed is the driver's answer to commit.
type committed struct {
	Phase      gym.Phase `json:"phase"`
	Manifest   manifest  `json:"manifest"`
	EpisodeIDs []string  `json:"episode_ids"`
}

// manifest is manifest.json (and the commit reply's copy), read strictly.
type manifest struct {
	SchemaVersion int    `json:"schema_version"`
	Kind          string `json:"kind"`
	Instance      string `json:"instance"`
	CheckpointID  string `json:"checkpoint_id"`
	RecordsFile   string `json:"records_file"`
	RecordsSHA256 string `json:"records_sha256"`
	RecordCount   int    `json:"record_count"`
}

// record is one committed run, as the test reads it back.
type record struct {
	ID       gym.EpisodeID
	Bookmark json.RawMessage // the run's bookmark, the adapter's state put back
}

// bookmark is the part of a bookmark the tests read.
type bookmark struct {
	V       int               `json:"v"`
	Next    string            `json:"next"`
	Restart bool              `json:"restart"`
	Cookies map[string]string `json:"cookies"`
	State   struct {
		SessionDir string `json:"session_dir"`
	} `json:"state"`
	Resume bool `json:"resume"`
	Paused *struct {
		ID  string `json:"id"`
		Dir string `json:"dir"`
	} `json:"paused"`
	Launches []launch `json:"launches"`
}

func (r record) bookmark(t *testing.T) bookmark {
	t.Helper()
	var b bookmark
	if err := json.Unmarshal(r.Bookmark, &b); err != nil {
		t.Fatalf("the bookmark of %s is not JSON: %v: %s", r.ID, err, r.Bookmark)
	}
	return b
}

// checkpoint is one committed checkpoint as the test controller ran it.
type checkpoint struct {
	id, dir string
	prep    prepared
	com     committed
	// records are the runs the commit wrote, by rollout id.
	records map[string]record
	// paused maps each rollout exported with its launch paused in place.
	paused map[string]bool
	// ownPrep and ownCom are the owner's replies, owned the sessions its
	// commit wrote, by rollout id.
	ownPrep prepared
	ownCom  committed
	owned   map[string]lending.Record
}

// prepareCommit runs a checkpoint's first half the coordinator's way:
// prepare the driver (every run parks), then the owner (its calls in
// flight end); commit the driver (the records of the runs), then the owner
// (a snapshot of each open session's sandbox), both into one
// checkpoint_dir with the same scope (every episode). Every run exported
// paused in place has an owner record of the same attempt, of the sandbox
// its launch was paused in, and the owner exports no episode the driver
// did not. Resume is the caller's (resumeAll). Each of between, if any, is
// called with the driver's prepare reply before the commits.
func (e *env) prepareCommit(id string, between ...func(prepared)) checkpoint {
	t := e.t
	t.Helper()
	ck := checkpoint{id: id, dir: filepath.Join(e.dir, "checkpoints", id), paused: map[string]bool{}}
	e.ctl.must(t, "prepare", plainBody(id), &ck.prep)
	if ck.prep.Phase != gym.PhasePrepared || !ck.prep.Report.Ready || len(ck.prep.Report.Blockers) != 0 || ck.prep.Report.BlockerCount != 0 {
		t.Fatalf("prepare %s: not every run parked: %+v", id, ck.prep)
	}
	if h := e.health(); h.Phase != "prepared" {
		t.Fatalf("after prepare the phase is %q, want prepared", h.Phase)
	}
	ck.ownPrep = e.prepareOwner(id)
	for _, f := range between {
		f(ck.prep)
	}
	e.ctl.must(t, "commit", commitBody(id, ck.dir, nil, false), &ck.com)
	ck.records = checkCommitted(t, ck.dir, id, ck.com)
	if n := ck.prep.Report.Counts["at_boundary"]; n != len(ck.records) {
		t.Errorf("prepare %s counted %d sessions at a boundary, the commit wrote %d records", id, n, len(ck.records))
	}
	if h := e.health(); h.Phase != "committed" {
		t.Fatalf("after commit the phase is %q, want committed", h.Phase)
	}
	for rollout, r := range ck.records {
		b := r.bookmark(t)
		if b.V != 1 {
			t.Errorf("commit %s: %s exported with bookmark version %d", id, rollout, b.V)
		}
		if b.Next == "harness" && b.Paused != nil {
			ck.paused[rollout] = true
		}
	}
	ck.ownCom, ck.owned = e.commitOwner(id, ck.dir, nil, false)
	for rollout := range ck.paused {
		b := ck.records[rollout].bookmark(t)
		o, ok := ck.owned[rollout]
		last := b.Launches[len(b.Launches)-1]
		if !ok || o.EpisodeID != ck.records[rollout].ID || o.State.SandboxID != last.SandboxID {
			t.Errorf("owner commit %s: the record of paused %s is %+v, want one of %s, sandbox %s", id, rollout, o, ck.records[rollout].ID.CaptureKey(), last.SandboxID)
		}
	}
	for rollout, o := range ck.owned {
		if r, ok := ck.records[rollout]; !ok || r.ID != o.EpisodeID {
			t.Errorf("owner commit %s exported %s, of which the driver wrote no record", id, o.EpisodeID.CaptureKey())
		}
	}
	return ck
}

// prepareOwner prepares the owner, which is then ready: no call in flight,
// no blocker.
func (e *env) prepareOwner(id string) prepared {
	t := e.t
	t.Helper()
	var prep prepared
	e.own.must(t, "prepare", plainBody(id), &prep)
	if prep.Phase != gym.PhasePrepared || !prep.Report.Ready || len(prep.Report.Blockers) != 0 || prep.Report.BlockerCount != 0 || prep.Report.Counts["inflight"] != 0 {
		t.Fatalf("owner prepare %s: %+v, want prepared, ready, nothing in flight", id, prep)
	}
	if s := e.own.status(t); s.Phase != gym.PhasePrepared || s.Kind != gym.KindResources || s.Instance != ownerInstance {
		t.Fatalf("owner status after prepare %s: %+v, want resources/%s prepared", id, s, ownerInstance)
	}
	return prep
}

// commitOwner commits the owner into dir and checks what it wrote
// (checkOwnerCommitted).
func (e *env) commitOwner(id, dir string, scope []gym.EpisodeID, stop bool) (committed, map[string]lending.Record) {
	t := e.t
	t.Helper()
	var com committed
	e.own.must(t, "commit", commitBody(id, dir, scope, stop), &com)
	return com, e.checkOwnerCommitted(dir, id, com)
}

// resume opens the checkpoint on the driver.
func (e *env) resume(id string) {
	e.t.Helper()
	var out gym.ResumeReply
	e.ctl.must(e.t, "resume", plainBody(id), &out)
	if out.Phase != gym.PhaseIdle || out.Idempotent {
		e.t.Fatalf("resume %s answered %+v, want phase idle, not idempotent", id, out)
	}
	if h := e.health(); h.Phase != "idle" {
		e.t.Fatalf("after resume the phase is %q, want idle", h.Phase)
	}
}

// resumeAll opens the checkpoint on both participants: the owner first,
// so the calls of the runs the driver lets go find its admission open.
func (e *env) resumeAll(id string) {
	e.t.Helper()
	var out gym.ResumeReply
	e.own.must(e.t, "resume", plainBody(id), &out)
	if out.Phase != gym.PhaseIdle || out.Idempotent {
		e.t.Fatalf("owner resume %s answered %+v, want phase idle, not idempotent", id, out)
	}
	if s := e.own.status(e.t); s.Phase != gym.PhaseIdle {
		e.t.Fatalf("after the owner's resume %s its status is %+v, want idle", id, s)
	}
	e.resume(id)
}

// ownerInstance is the owner's participant instance (owner serve's
// default --instance).
const ownerInstance = "ngdriver_owner"

// readManifest reads a participant's manifest.json strictly (a field the
// test does not know fails it).
func readManifest(t *testing.T, pdir string) manifest {
	t.Helper()
	path := filepath.Join(pdir, gym.ManifestName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the commit's manifest: %v", err)
	}
	var m manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("%s: %v: %s", path, err, data)
	}
	return m
}

// checkOwnerCommitted checks what the owner's commit wrote under dir:
// manifest.json (read strictly) names the checkpoint, kind resources and
// the owner's instance, and the commit's reply carries it with the
// capture keys of exactly the records written; gym.ReadState verifies the
// records file against it; each record is a lending.Record (read
// strictly) of the local provider, not a restart, whose snapshot is on
// disk. It returns the records by rollout id.
func (e *env) checkOwnerCommitted(dir, id string, com committed) map[string]lending.Record {
	t := e.t
	t.Helper()
	pdir, err := gym.ParticipantDir(dir, gym.KindResources, ownerInstance)
	if err != nil {
		t.Fatal(err)
	}
	m := readManifest(t, pdir)
	if m.SchemaVersion != 1 || m.Kind != gym.KindResources || m.Instance != ownerInstance || m.CheckpointID != id ||
		m.RecordsFile != "records-"+m.RecordsSHA256+".jsonl" {
		t.Errorf("%s: bad manifest %+v", pdir, m)
	}
	if com.Phase != gym.PhaseCommitted || com.Manifest != m {
		t.Errorf("owner commit %s answered %+v, want phase committed and the manifest written %+v", id, com, m)
	}
	out := map[string]lending.Record{}
	var keys []string
	read, err := gym.ReadState(dir, gym.KindResources, ownerInstance, func(r gym.Record) error {
		dec := json.NewDecoder(bytes.NewReader(r.JSON))
		dec.DisallowUnknownFields()
		var rec lending.Record
		if err := dec.Decode(&rec); err != nil {
			return fmt.Errorf("the record of %s: %v: %s", r.EpisodeID.CaptureKey(), err, r.JSON)
		}
		st := rec.State
		if rec.EpisodeID != r.EpisodeID || rec.SessionID == "" || st.Provider != "local" || st.Snapshot == "" || st.SandboxID == "" ||
			st.Restart || !json.Valid(st.RunBody) {
			return fmt.Errorf("the record of %s: %s, want a session of the local provider with a snapshot and its run body", r.EpisodeID.CaptureKey(), r.JSON)
		}
		if _, err := os.Stat(filepath.Join(e.base, "snapshots", st.Snapshot)); err != nil {
			return fmt.Errorf("the snapshot of %s: %v", r.EpisodeID.CaptureKey(), err)
		}
		if _, dup := out[rec.EpisodeID.RolloutID]; dup {
			return fmt.Errorf("two records of %s", rec.EpisodeID.RolloutID)
		}
		out[rec.EpisodeID.RolloutID] = rec
		keys = append(keys, rec.EpisodeID.CaptureKey())
		return nil
	})
	if err != nil {
		t.Fatalf("the owner's records of %s: %v", id, err)
	}
	if read.RecordCount != m.RecordCount || read.RecordsSHA256 != m.RecordsSHA256 || len(keys) != m.RecordCount {
		t.Errorf("%s: %d records read, manifest read back %+v, want %+v", pdir, len(keys), read, m)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, com.EpisodeIDs) && !(len(keys) == 0 && len(com.EpisodeIDs) == 0) {
		t.Errorf("owner commit %s answered episode_ids %v, the records written are %v", id, com.EpisodeIDs, keys)
	}
	return out
}

// restoreOwner restores the owner from dir under checkpoint id, scoped to
// the episodes in scope, and checks its reply: phase restored, from
// source, the capture keys of the next attempt of each of want's records.
func (e *env) restoreOwner(id, dir string, scope []gym.EpisodeID, source string, want map[string]lending.Record) {
	t := e.t
	t.Helper()
	var r gym.RestoreReply
	e.own.must(t, "restore", restoreBody(id, dir, scope), &r)
	var keys []string
	for _, rec := range want {
		keys = append(keys, rec.EpisodeID.Next().CaptureKey())
	}
	slices.Sort(keys)
	if r.Phase != gym.PhaseRestored || r.SourceCheckpointID != source || !slices.Equal(r.Restored, keys) {
		t.Fatalf("the owner's restore %s answered %+v, want phase restored from %s, restored %v", id, r, source, keys)
	}
	if s := e.own.status(t); s.Phase != gym.PhaseRestored || s.CheckpointID == nil || *s.CheckpointID != id {
		t.Fatalf("owner status after the restore %s: %+v, want restored under it", id, s)
	}
}

// participantDir is where the driver keeps its records under a checkpoint
// folder.
func participantDir(dir string) string {
	return filepath.Join(dir, "gym", gym.KindAgent, driverName)
}

// checkCommitted checks what a commit wrote under dir, read strictly (a
// field the test does not know fails it): manifest.json names the
// checkpoint, the driver's kind and instance, and a records file whose
// sha256 and line count it holds; the commit's reply carries the same
// manifest and the capture keys of exactly the records written; each
// record is a driver.AgentRecord of the fake adapter whose session key is
// its rollout. It returns the records by rollout id.
func checkCommitted(t *testing.T, dir, id string, com committed) map[string]record {
	t.Helper()
	pdir := participantDir(dir)
	m := readManifest(t, pdir)
	if m.SchemaVersion != 1 || m.Kind != gym.KindAgent || m.Instance != driverName || m.CheckpointID != id ||
		m.RecordsFile != "records-"+m.RecordsSHA256+".jsonl" {
		t.Errorf("%s: bad manifest %+v", pdir, m)
	}
	if com.Phase != gym.PhaseCommitted || com.Manifest != m {
		t.Errorf("commit %s answered %+v, want phase committed and the manifest written %+v", id, com, m)
	}
	path := filepath.Join(pdir, m.RecordsFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("records file: %v", err)
	}
	if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != m.RecordsSHA256 {
		t.Errorf("%s: its sha256 is not the manifest's %s", path, m.RecordsSHA256)
	}
	out := map[string]record{}
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		var ar driver.AgentRecord
		if err := dec.Decode(&ar); err != nil {
			t.Fatalf("%s line %d: %v: %s", path, n, err, sc.Text())
		}
		if ar.SessionKey != ar.EpisodeID.RolloutID || ar.Session.Adapter != "fake" || string(ar.Boundary) != "null" {
			t.Errorf("%s line %d: %+v, want the fake adapter's session keyed by its rollout, boundary null", path, n, ar)
		}
		gr, err := gym.ParseRecord(sc.Bytes())
		if err != nil {
			t.Fatalf("%s line %d: %v", path, n, err)
		}
		_, b, err := driver.ParseAgentRecord(gr)
		if err != nil {
			t.Fatalf("%s line %d: %v", path, n, err)
		}
		bm, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := out[ar.EpisodeID.RolloutID]; dup {
			t.Errorf("%s: two records of %s", path, ar.EpisodeID.RolloutID)
		}
		out[ar.EpisodeID.RolloutID] = record{ID: ar.EpisodeID, Bookmark: bm}
		keys = append(keys, ar.EpisodeID.CaptureKey())
	}
	if len(keys) != m.RecordCount {
		t.Errorf("%s holds %d records, its manifest says %d", path, len(keys), m.RecordCount)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, com.EpisodeIDs) && !(len(keys) == 0 && len(com.EpisodeIDs) == 0) {
		t.Errorf("commit %s answered episode_ids %v, the records written are %v", id, com.EpisodeIDs, keys)
	}
	return out
}

// writeRecords stores records as the driver's commit of checkpoint id
// would, through pkg/gym's store, and returns the folder.
func writeRecords(t *testing.T, dir, id string, recs ...driver.AgentRecord) string {
	t.Helper()
	var out []gym.Record
	for _, r := range recs {
		gr, err := gym.NewRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, gr)
	}
	if _, err := gym.WriteState(dir, gym.KindAgent, driverName, id, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// seedRecord is the record of a run exported before its seed.
func seedRecord(rollout string, attempt int) driver.AgentRecord {
	return driver.AgentRecord{
		EpisodeID: gym.EpisodeID{RolloutID: rollout, Attempt: attempt}, SessionKey: rollout,
		Session: driver.AgentSession{Adapter: "fake"}, Boundary: json.RawMessage("null"),
		Episode: json.RawMessage(`{"v":1,"next":"seed"}`),
	}
}
