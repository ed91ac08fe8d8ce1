package gym

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"time"
)

// Route names and the prefix Gym's control routes live under
// (control.py CHECKPOINT_ROUTE_PREFIX); the routes table (routes.go) says
// what each one takes.
const (
	RoutePrefix = "/ng-control/v1/checkpoint"
	OpStatus    = "status"
	OpPrepare   = "prepare"
	OpRenew     = "renew"
	OpRetire    = "retire"
	OpForget    = "forget"
	OpCommit    = "commit"
	OpRestore   = "restore"
	OpResume    = "resume"
)

// MaxCheckpointIDLen is the longest checkpoint id Gym's request model takes.
const MaxCheckpointIDLen = 128

// MaxReportedBlockers caps the blocker keys a report lists, so a prepare
// that misses its deadline with thousands of stragglers still answers
// small; Report.BlockerCount is always the full count.
const MaxReportedBlockers = 100

// Request is the body of prepare, renew and resume, and the part every
// other body starts with (Gym's CheckpointRequest): the checkpoint id and
// the absolute deadline in seconds since the Unix epoch.
type Request struct {
	CheckpointID string  `json:"checkpoint_id"`
	DeadlineTS   float64 `json:"deadline_ts"`
}

// Deadline is DeadlineTS as a time.
func (r Request) Deadline() time.Time {
	sec, frac := math.Modf(r.DeadlineTS)
	return time.Unix(int64(sec), int64(frac*1e9))
}

// CommitRequest is the body of commit. EpisodeIDs, when set, is the scope:
// the episodes the controller continues from this checkpoint (nil means
// every one; an empty list means none). Stop says the controller stops
// after this checkpoint: once the write is durable, participants free what
// their exported state holds outside the process (sandboxes).
type CommitRequest struct {
	Request
	CheckpointDir string      `json:"checkpoint_dir"`
	EpisodeIDs    []EpisodeID `json:"episode_ids"`
	Stop          bool        `json:"stop"`
}

// RestoreRequest is the body of restore: the folder to read and the
// checkpointed attempts the controller will continue (records of other
// episodes are not installed).
type RestoreRequest struct {
	Request
	CheckpointDir string      `json:"checkpoint_dir"`
	EpisodeIDs    []EpisodeID `json:"episode_ids"`
}

// RetireRequest is the body of retire: at least one attempt to refuse,
// stop and free, together with every earlier attempt of its rollout.
type RetireRequest struct {
	Request
	EpisodeIDs []EpisodeID `json:"episode_ids"`
}

// ForgetRequest is the body of forget: rollouts finished for good, whose
// retired attempts need no refusing any more. Gym checks only that the
// list is non-empty, not the ids' form.
type ForgetRequest struct {
	Request
	RolloutIDs []string `json:"rollout_ids"`
}

// DecodeRequest reads the body of operation op (a POST route of the
// routes table) as Gym's request models do: a JSON object, no fields but
// the route's, every rule checked. It returns *Request, *CommitRequest,
// *RestoreRequest, *RetireRequest or *ForgetRequest; a bad body is an
// ErrInvalidRequest.
func DecodeRequest(op string, body []byte) (any, error) {
	r, ok := routeOf[op]
	if !ok || r.method != http.MethodPost {
		return nil, Refuse(ErrInvalidRequest, "unknown operation %q", op)
	}
	if err := singleValue(body); err != nil {
		return nil, err
	}
	f, err := strictObject(body, op+" body", append([]string{"checkpoint_id", "deadline_ts"}, r.fields...)...)
	if err != nil {
		return nil, err
	}
	base, err := decodeBase(f)
	if err != nil {
		return nil, err
	}
	if r.decode == nil {
		return &base, nil
	}
	return r.decode(base, f)
}

// decodeCommit reads the rest of a commit body.
func decodeCommit(base Request, f map[string]json.RawMessage) (any, error) {
	r := &CommitRequest{Request: base}
	var err error
	if r.CheckpointDir, err = requiredDir(f); err != nil {
		return nil, err
	}
	if raw, ok := f["episode_ids"]; ok && !isNull(raw) {
		if r.EpisodeIDs, err = decodeEpisodeIDs(raw); err != nil {
			return nil, err
		}
	}
	if raw, ok := f["stop"]; ok {
		if err := decodeBool(raw, "stop", &r.Stop); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// decodeRestore reads the rest of a restore body.
func decodeRestore(base Request, f map[string]json.RawMessage) (any, error) {
	r := &RestoreRequest{Request: base}
	var err error
	if r.CheckpointDir, err = requiredDir(f); err != nil {
		return nil, err
	}
	raw, ok := f["episode_ids"]
	if !ok {
		return nil, Refuse(ErrInvalidRequest, "episode_ids is required")
	}
	if r.EpisodeIDs, err = decodeEpisodeIDs(raw); err != nil {
		return nil, err
	}
	return r, nil
}

// decodeRetire reads the rest of a retire body.
func decodeRetire(base Request, f map[string]json.RawMessage) (any, error) {
	r := &RetireRequest{Request: base}
	raw, ok := f["episode_ids"]
	if !ok {
		return nil, Refuse(ErrInvalidRequest, "episode_ids is required")
	}
	var err error
	if r.EpisodeIDs, err = decodeEpisodeIDs(raw); err != nil {
		return nil, err
	}
	if len(r.EpisodeIDs) == 0 {
		return nil, Refuse(ErrInvalidRequest, "episode_ids must name at least one episode")
	}
	return r, nil
}

// decodeForget reads the rest of a forget body.
func decodeForget(base Request, f map[string]json.RawMessage) (any, error) {
	r := &ForgetRequest{Request: base}
	raw, ok := f["rollout_ids"]
	if !ok {
		return nil, Refuse(ErrInvalidRequest, "rollout_ids is required")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || isNull(raw) {
		return nil, Refuse(ErrInvalidRequest, "rollout_ids must be a list of strings")
	}
	if len(items) == 0 {
		return nil, Refuse(ErrInvalidRequest, "rollout_ids must name at least one rollout")
	}
	r.RolloutIDs = make([]string, len(items))
	for i, item := range items {
		if err := decodeString(item, "rollout_ids item", &r.RolloutIDs[i]); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// singleValue refuses a body that is not exactly one JSON value.
func singleValue(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return Refuse(ErrInvalidRequest, "body is not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err == nil {
		return Refuse(ErrInvalidRequest, "body holds more than one JSON value")
	}
	return nil
}

func decodeBase(f map[string]json.RawMessage) (Request, error) {
	var r Request
	raw, ok := f["checkpoint_id"]
	if !ok {
		return r, Refuse(ErrInvalidRequest, "checkpoint_id is required")
	}
	if err := decodeString(raw, "checkpoint_id", &r.CheckpointID); err != nil {
		return r, err
	}
	if err := ValidateCheckpointID(r.CheckpointID); err != nil {
		return r, err
	}
	raw, ok = f["deadline_ts"]
	if !ok {
		return r, Refuse(ErrInvalidRequest, "deadline_ts is required")
	}
	var err error
	if r.DeadlineTS, err = decodeFloat(raw, "deadline_ts"); err != nil {
		return r, err
	}
	if math.IsInf(r.DeadlineTS, 0) || math.IsNaN(r.DeadlineTS) {
		return r, Refuse(ErrInvalidRequest, "deadline_ts must be finite")
	}
	return r, nil
}

// ValidateCheckpointID checks Gym's rule for a checkpoint id: 1 to 128
// characters matching NamePattern.
func ValidateCheckpointID(id string) error {
	if id == "" || len(id) > MaxCheckpointIDLen || !NamePattern.MatchString(id) {
		return Refuse(ErrInvalidRequest, "checkpoint_id %q must be 1 to %d letters, digits, dots, dashes or underscores starting with a letter or digit", id, MaxCheckpointIDLen)
	}
	return nil
}

func requiredDir(f map[string]json.RawMessage) (string, error) {
	raw, ok := f["checkpoint_dir"]
	if !ok {
		return "", Refuse(ErrInvalidRequest, "checkpoint_dir is required")
	}
	var dir string
	if err := decodeString(raw, "checkpoint_dir", &dir); err != nil {
		return "", err
	}
	if dir == "" {
		return "", Refuse(ErrInvalidRequest, "checkpoint_dir must not be empty")
	}
	return dir, nil
}

func decodeEpisodeIDs(raw json.RawMessage) ([]EpisodeID, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || isNull(raw) {
		return nil, Refuse(ErrInvalidRequest, "episode_ids must be a list of episode id objects")
	}
	ids := make([]EpisodeID, len(items))
	for i, item := range items {
		if err := ids[i].UnmarshalJSON(item); err != nil {
			return nil, Refuse(ErrInvalidRequest, "episode_ids[%d]: %v", i, err)
		}
	}
	return ids, nil
}

// Report says whether a participant's frozen state can be committed and
// what blocks it otherwise (Gym's PrepareReport). Blockers and Restarts are
// capture keys. Build it with NewReport, which caps Blockers.
type Report struct {
	// Ready: every live execution is at a committable boundary.
	Ready bool `json:"ready"`
	// Blockers lists at most MaxReportedBlockers keys still preventing a cut.
	Blockers []string `json:"blockers"`
	// BlockerCount is the full number of blockers.
	BlockerCount int `json:"blocker_count"`
	// Counts are the participant's own figures (the agent: sessions, at_boundary).
	Counts map[string]int `json:"counts"`
	// Restarts are in-flight episodes this participant cannot capture: they
	// never block, the controller leaves them out of the commit scope and
	// starts them over after a crash. Never capped.
	Restarts []string `json:"restarts"`
}

// NewReport builds a report from every blocker, listing at most
// MaxReportedBlockers of them and counting all.
func NewReport(ready bool, blockers []string, counts map[string]int, restarts []string) Report {
	r := Report{Ready: ready, BlockerCount: len(blockers), Counts: counts, Restarts: restarts}
	r.Blockers = slices.Clone(blockers[:min(len(blockers), MaxReportedBlockers)])
	return r
}

// MarshalJSON writes empty lists and maps as [] and {}, as Gym's defaults do.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	p := plain(r)
	if p.Blockers == nil {
		p.Blockers = []string{}
	}
	if p.Counts == nil {
		p.Counts = map[string]int{}
	}
	if p.Restarts == nil {
		p.Restarts = []string{}
	}
	return json.Marshal(p)
}

// StatusReply answers GET status. The coordinator discovers participants
// with it. CheckpointID and LeaseExpiresAt are null when idle; Extra holds
// the participant's own fields (the agent's "accepting"), written beside
// the others at the top level.
type StatusReply struct {
	Kind            string         `json:"kind"`
	Instance        string         `json:"instance"`
	Phase           Phase          `json:"phase"`
	CheckpointID    *string        `json:"checkpoint_id"`
	LeaseExpiresAt  *float64       `json:"lease_expires_at"`
	RetiredRollouts int            `json:"retired_rollouts"`
	Report          Report         `json:"report"`
	Extra           map[string]any `json:"-"`
}

// MarshalJSON merges Extra into the object; as in Gym, an extra field of
// the same name wins.
func (s StatusReply) MarshalJSON() ([]byte, error) {
	type plain StatusReply
	return withExtra(plain(s), s.Extra)
}

// PrepareReply answers prepare: the phase reached (prepared, or preparing
// when the deadline passed with blockers left, or idle when a resume ended
// the checkpoint meanwhile) and the report.
type PrepareReply struct {
	Phase  Phase  `json:"phase"`
	Report Report `json:"report"`
}

// RenewReply answers renew with the lease's new end (epoch seconds).
type RenewReply struct {
	LeaseExpiresAt float64 `json:"lease_expires_at"`
}

// RetireReply answers retire with the capture keys retired, in request order.
type RetireReply struct {
	Retired []string `json:"retired"`
}

// ForgetReply answers forget with the rollout ids, sorted.
type ForgetReply struct {
	Forgotten []string `json:"forgotten"`
}

// CommitReply answers commit: phase committed, the manifest as written (or
// found), the sorted capture keys of the records written, and the
// participant's own fields (Extra) beside them.
type CommitReply struct {
	Phase      Phase          `json:"phase"`
	Manifest   Manifest       `json:"manifest"`
	EpisodeIDs []string       `json:"episode_ids"`
	Extra      map[string]any `json:"-"`
}

// MarshalJSON merges Extra into the object, an extra field winning.
func (c CommitReply) MarshalJSON() ([]byte, error) {
	type plain CommitReply
	if c.EpisodeIDs == nil {
		c.EpisodeIDs = []string{}
	}
	return withExtra(plain(c), c.Extra)
}

// RestoreReply answers restore: phase restored, the checkpoint id the
// manifest names, and the sorted capture keys of the attempts (attempt + 1
// of each record) that continue.
type RestoreReply struct {
	Phase              Phase    `json:"phase"`
	SourceCheckpointID string   `json:"source_checkpoint_id"`
	Restored           []string `json:"restored"`
}

// ResumeReply answers resume. Idempotent is true when there was nothing to
// resume: the id was resumed before, or no checkpoint was open (the id is
// then fenced, so a delayed prepare of it cannot close admission).
type ResumeReply struct {
	Phase      Phase `json:"phase"`
	Idempotent bool  `json:"idempotent"`
}

// withExtra marshals v and writes extra's fields over it.
func withExtra(v any, extra map[string]any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil || len(extra) == 0 {
		return data, err
	}
	var merged map[string]json.RawMessage
	if err := json.Unmarshal(data, &merged); err != nil {
		return nil, err
	}
	for k, x := range extra {
		b, err := json.Marshal(x)
		if err != nil {
			return nil, err
		}
		merged[k] = b
	}
	return json.Marshal(merged)
}
