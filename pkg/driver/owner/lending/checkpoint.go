package lending

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/gym"
)

// The Owner is Gym's resources participant (nemo_gym/_checkpoint/
// resources.py, mode "exported"): sessions are bound to the attempt whose
// capture key their seed named, calls wait while a checkpoint has
// admission closed (admission.go), a prepare is ready once no call it
// waits for is in flight, a commit exports one record per open session
// with a snapshot of its sandbox, and a restore forks each snapshot into
// a sandbox of the next attempt. Sessions without a key are not part of
// any checkpoint.
var (
	_ owner.CheckpointOwner = (*Owner)(nil)
	_ gym.Readier           = (*Owner)(nil)
	_ gym.WriteWatcher      = (*Owner)(nil)
)

// Mode is the resources checkpoint mode the owner reports: it exports
// each session's state (a snapshot of its sandbox).
const Mode = "exported"

// Record is one exported session as the store keeps it, in the shape of
// Gym's ResourcesSessionRecord: the attempt, the session's id (kept across
// the restore) and its state. A restore validates it field for field as
// Gym's model does (extra="forbid"; episode_id, session_id and state
// required) and its state as this owner wrote it.
type Record struct {
	EpisodeID gym.EpisodeID `json:"episode_id"`
	SessionID string        `json:"session_id"`
	State     SessionState  `json:"state"`
	// Owner is Gym's routing owner of the session (the worker its cookie
	// names when a server runs several). This owner is one process: it
	// never writes one and ignores one it reads.
	Owner *string `json:"owner,omitempty"`
}

// SessionState is what a restore in a fresh owner process needs to bring
// a session back: the snapshot and the provider that holds it, the run
// body it was seeded with (its flags and files), and where its sandbox
// was.
type SessionState struct {
	// Provider is the lender's name (sandbox.Lender.Name); a restore refuses a
	// record of another provider.
	Provider string `json:"provider"`
	// Snapshot is the id of the snapshot taken at the commit.
	Snapshot string `json:"snapshot"`
	// SandboxID, Generation and Workdir are the sandbox snapshotted: the
	// restore stops it if it still runs, and forks to a later generation.
	SandboxID  string `json:"sandbox_id"`
	Generation int    `json:"generation"`
	Workdir    string `json:"workdir"`
	// RunBody is the body the session was seeded with.
	RunBody json.RawMessage `json:"run_body"`
	// VerifyMode and Restart are the seed reply's headers (Restart is
	// always false: such a session is never exported).
	VerifyMode string `json:"verify_mode"`
	Restart    bool   `json:"restart"`
	// CookieSHA256 is the hex SHA-256 of the secret of the session's
	// cookie (CookieName), never the secret: the restored session is
	// continued by the caller that holds the cookie (a driver keeps it in
	// its bookmark). Empty in a record of an owner before the rule: the
	// session's id was its cookie.
	CookieSHA256 string `json:"cookie_sha256,omitempty"`
}

// Kind implements gym.Participant.
func (o *Owner) Kind() string { return gym.KindResources }

// Ready implements gym.Readier.
func (o *Owner) Ready() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.inflight > 0 {
		return false
	}
	for _, s := range o.byKey {
		if s.retired && !s.freed {
			return false
		}
	}
	return true
}

// Readiness implements gym.Participant, as Gym's resources participant
// counts: ready once no call the checkpoint waits for is in flight
// (a seed, a verify that does not replay, ...) and no retire was cut
// short; blockers are the attempts whose retire has not freed them yet;
// counts are {"inflight", "sessions"} (open sessions bound to an attempt);
// restarts are the attempts whose session cannot be captured (no sandbox,
// or a body asking to restart).
func (o *Owner) Readiness() gym.Report {
	o.mu.Lock()
	defer o.mu.Unlock()
	var blockers, restarts []string
	sessions := 0
	for key, s := range o.byKey {
		switch {
		case s.retired && !s.freed:
			blockers = append(blockers, key)
			sessions++
		case s.retired || s.failed || !o.live(s):
		default:
			sessions++
			if !s.capturable() {
				restarts = append(restarts, key)
			}
		}
	}
	sort.Strings(blockers)
	sort.Strings(restarts)
	return gym.NewReport(o.inflight == 0 && len(blockers) == 0, blockers,
		map[string]int{"inflight": o.inflight, "sessions": sessions}, restarts)
}

// live reports whether a session is open (o.mu held). Its closed flag is
// s.mu's; a call holding s.mu changes it only while it counts as in
// flight, so a racy read only matters while the report says not ready.
func (o *Owner) live(s *session) bool {
	if !s.mu.TryLock() {
		return true // a call is using it: it is open
	}
	defer s.mu.Unlock()
	return !s.closed && !s.parked
}

// StatusExtra implements gym.StatusExtender: Gym's resources extras
// (retired_sessions: sessions refused as stale until their rollout is
// forgotten). verify is the default mode; a session whose run body says
// verify_mode "replay" replays its verify.
func (o *Owner) StatusExtra() map[string]any {
	o.mu.Lock()
	defer o.mu.Unlock()
	retired := 0
	for _, s := range o.sessions {
		if o.staleLocked(s) {
			retired++
		}
	}
	return map[string]any{"mode": Mode, "verify": "wait", "retired_sessions": retired}
}

// exportable lists the open, capturable, bound sessions in scope (nil:
// all), by key.
func (o *Owner) exportable(scope []gym.EpisodeID) []*session {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*session
	for _, s := range o.byKey {
		if s.retired || s.failed || !s.capturable() || (scope != nil && !slices.Contains(scope, s.episode)) {
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].episode.CaptureKey() < out[j].episode.CaptureKey() })
	return out
}

// Export implements gym.Participant: it snapshots the sandbox of every
// open session in scope (the calls are held by the closed admission) and
// returns a Record per session. A session whose sandbox is gone is left
// out with a warning and ends, as Gym drops a session its server dropped.
// First it removes the snapshots of earlier exports that no checkpoint on
// disk names any more (sweepSnapshots).
func (o *Owner) Export(ctx context.Context, scope []gym.EpisodeID) ([]gym.Record, error) {
	o.ckMu.Lock()
	defer o.ckMu.Unlock()
	o.mu.Lock()
	checkpointID := o.checkpointID
	o.mu.Unlock()
	if checkpointID == "" {
		checkpointID = "export-" + newSessionID()[:8]
	}
	o.sweepSnapshots(ctx, checkpointID)
	ex := o.exports[checkpointID]
	if ex == nil {
		ex = &export{snaps: map[string]string{}}
		o.exports[checkpointID] = ex
	}
	var exMu sync.Mutex // guards ex.snaps while sessions are copied at once
	sessions := o.exportable(scope)
	records := make([]*gym.Record, len(sessions))
	index := make(map[*session]int, len(sessions))
	for i, s := range sessions {
		index[s] = i
	}
	err := forEach(sessions, func(s *session) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		o.mu.Lock()
		id := s.episode
		o.mu.Unlock()
		if s.closed || s.parked || s.sandboxID == "" {
			return nil
		}
		start := time.Now()
		snap, err := o.opt.Sandboxes.Snapshot(ctx, s.sandboxID, snapshotID(checkpointID, s.id))
		if errors.Is(err, sandbox.ErrGone) {
			// Nothing to continue: the session ends rather than fail the commit.
			o.log.Warn("the sandbox of a session is gone; not exported, and the session ends", "session", s.id, "key", id.CaptureKey(), "sandbox", s.sandboxID)
			s.closed = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("session %s of %s: %w", s.id, id.CaptureKey(), err)
		}
		s.snapshots[checkpointID] = snap
		exMu.Lock()
		ex.snaps[s.id] = snap
		exMu.Unlock()
		rec, err := gym.NewRecord(Record{EpisodeID: id, SessionID: s.id, State: SessionState{
			Provider: o.opt.Sandboxes.Name(), Snapshot: snap,
			SandboxID: s.sandboxID, Generation: s.generation, Workdir: s.workdir,
			RunBody: s.raw, VerifyMode: s.body.VerifyMode, Restart: s.body.Restart,
			CookieSHA256: hex.EncodeToString(s.secret[:]),
		}})
		if err != nil {
			return err
		}
		records[index[s]] = &rec
		o.log.Info("sandbox snapshotted", "checkpoint", checkpointID, "session", s.id, "key", id.CaptureKey(),
			"sandbox", s.sandboxID, "snapshot", snap, "took", time.Since(start))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("owner: export for checkpoint %s: %w", checkpointID, err)
	}
	out := make([]gym.Record, 0, len(records))
	for _, r := range records {
		if r != nil {
			out = append(out, *r)
		}
	}
	return out, nil
}

// export is the snapshots one checkpoint's Export took, and where its
// records went.
type export struct {
	// dir is the participant folder the records were written to (Writing);
	// "" while no write of them started.
	dir   string
	snaps map[string]string // session id -> snapshot id
}

// Writing implements gym.WriteWatcher: the records of checkpointID are
// being written to dir, whose manifest will name the checkpoint once it is
// durable.
func (o *Owner) Writing(checkpointID, dir string) {
	o.ckMu.Lock()
	defer o.ckMu.Unlock()
	if ex := o.exports[checkpointID]; ex != nil {
		ex.dir = dir
	}
}

// sweepSnapshots removes the snapshots of the earlier exports (every one
// but current's) that no checkpoint on disk names: a snapshot lives as long
// as a checkpoint that still exists names it, and only that long. Gym never
// says whether a checkpoint completed (another participant's commit may
// have failed and the controller resumed without publishing it), so the
// rule is the disk's: an export is kept while the manifest in the folder
// its records were written to names its checkpoint; once the controller
// has deleted that checkpoint, or when its write never published (it
// failed, or a resume stopped it; an earlier checkpoint is over by the
// time a later one exports), its snapshots go: no manifest there (or a
// file where one of its folders should be) means none. A manifest that cannot be
// read for another reason keeps them (and is tried again at the next
// export), and so does a snapshot that cannot be removed (ckMu held).
func (o *Owner) sweepSnapshots(ctx context.Context, current string) {
	for id, ex := range o.exports {
		if id == current {
			continue
		}
		if len(ex.snaps) == 0 {
			delete(o.exports, id)
			continue
		}
		if ex.dir != "" {
			named, err := gym.ManifestCheckpointID(ex.dir)
			if err == nil && named == id {
				continue
			}
			if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
				o.log.Warn("cannot tell whether a checkpoint is still on disk; its snapshots are kept", "checkpoint", id, "dir", ex.dir, "err", err)
				continue
			}
		}
		for sessionID, snap := range ex.snaps {
			if err := o.opt.Sandboxes.RemoveSnapshot(ctx, snap); err != nil {
				o.log.Warn("remove the snapshot of a checkpoint no folder holds", "checkpoint", id, "snapshot", snap, "err", err)
				continue
			}
			delete(ex.snaps, sessionID)
			o.mu.Lock()
			s := o.sessions[sessionID]
			o.mu.Unlock()
			if s != nil {
				s.mu.Lock()
				if s.snapshots[id] == snap {
					delete(s.snapshots, id)
				}
				s.mu.Unlock()
			}
			o.log.Info("snapshot removed: no checkpoint on disk names it", "checkpoint", id, "session", sessionID, "snapshot", snap, "dir", ex.dir)
		}
		if len(ex.snaps) == 0 {
			delete(o.exports, id)
		}
	}
}

// install is one record, checked, with the fork made for it.
type install struct {
	rec    Record
	body   runBody
	secret [sha256.Size]byte
	fork   sandbox.Sandbox
	gen    int
}

// decodeRecords checks every record: its shape (field for field, as
// Record says), its provider, its run body, and that no two continue the
// same session or attempt. An invalid
// one is gym.ErrCheckpointState naming its episode.
func (o *Owner) decodeRecords(records []gym.Record) ([]*install, error) {
	out := make([]*install, 0, len(records))
	sessions, keys := map[string]bool{}, map[string]bool{}
	for _, r := range records {
		bad := func(format string, args ...any) error {
			return gym.Refuse(gym.ErrCheckpointState, "resources record of episode %q: %s", r.EpisodeID.CaptureKey(), fmt.Sprintf(format, args...))
		}
		var in install
		if err := r.DecodeStrict(&in.rec, "episode_id", "session_id", "state"); err != nil {
			return nil, err
		}
		st := in.rec.State
		switch {
		case in.rec.SessionID == "" || !gym.NamePattern.MatchString(in.rec.SessionID):
			return nil, bad("session_id %q is not a session id", in.rec.SessionID)
		case st.Snapshot == "":
			return nil, bad("no snapshot")
		case st.Provider != o.opt.Sandboxes.Name():
			return nil, bad("its snapshot is at provider %q, this owner lends %q sandboxes", st.Provider, o.opt.Sandboxes.Name())
		case st.Restart:
			return nil, bad("a restart session cannot be restored")
		case st.Generation < 0:
			return nil, bad("generation %d is negative", st.Generation)
		case sessions[in.rec.SessionID] || keys[r.EpisodeID.CaptureKey()]:
			return nil, bad("a second record of session %s or of its attempt", in.rec.SessionID)
		}
		switch sum, err := hex.DecodeString(st.CookieSHA256); {
		case st.CookieSHA256 == "":
			// A record of an owner before the cookie's secret: the id was the cookie.
			in.secret = sha256.Sum256([]byte(in.rec.SessionID))
		case err != nil || len(sum) != sha256.Size:
			return nil, bad("cookie_sha256 is not the hex of a SHA-256")
		default:
			copy(in.secret[:], sum)
		}
		body, err := parseRunBody(st.RunBody)
		if err != nil {
			return nil, bad("%v", err)
		}
		if body.Restart || body.NoSandbox {
			return nil, bad("its run body cannot be captured (restart or no_sandbox)")
		}
		in.body = body
		sessions[in.rec.SessionID], keys[r.EpisodeID.CaptureKey()] = true, true
		out = append(out, &in)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, in := range out {
		next := in.rec.EpisodeID.Next().CaptureKey()
		if s := o.byKey[next]; s != nil && s.id != in.rec.SessionID && !s.freed {
			return nil, gym.Refuse(gym.ErrCheckpointState, "resources record of episode %q: attempt %s already has session %s here", in.rec.EpisodeID.CaptureKey(), next, s.id)
		}
	}
	return out, nil
}

// Install implements gym.Participant: it checks every record, then forks
// each snapshot into a new sandbox (sb-<session>-<generation + 1>, or the
// next free name) and binds the session, under its old id, to the next
// attempt's key, so that attempt's seed continues it. All or nothing: if
// a fork fails the forks made are removed and nothing is installed. Once
// all exist, the sandboxes they replace are stopped (the crashed process's
// may still run): a session of this process with the same id, and the
// sandbox the record was exported from.
func (o *Owner) Install(ctx context.Context, records []gym.Record, scope []gym.EpisodeID) error {
	o.ckMu.Lock()
	defer o.ckMu.Unlock()
	ins, err := o.decodeRecords(records)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var made []*install
	err = forEach(ins, func(in *install) error {
		fork, gen, err := o.forkNext(ctx, in.rec.State.Snapshot, in.rec.SessionID, in.rec.State.Generation)
		if err != nil {
			return gym.Refuse(gym.ErrCheckpointState, "resources record of episode %q: fork snapshot %s: %v", in.rec.EpisodeID.CaptureKey(), in.rec.State.Snapshot, err)
		}
		in.fork, in.gen = fork, gen
		mu.Lock()
		made = append(made, in)
		mu.Unlock()
		return nil
	})
	if err != nil {
		for _, in := range made {
			if rerr := o.opt.Sandboxes.Remove(context.WithoutCancel(ctx), in.fork.ID()); rerr != nil {
				o.log.Warn("remove a fork of a failed restore", "sandbox", in.fork.ID(), "err", rerr)
			}
		}
		return fmt.Errorf("owner: restore: %w", err)
	}
	var replaced []string
	by := map[string]string{} // replaced sandbox -> its session
	for _, in := range ins {
		for _, id := range o.installOne(in) {
			if _, dup := by[id]; !dup {
				replaced = append(replaced, id)
				by[id] = in.rec.SessionID
			}
		}
	}
	// The sandboxes the forks replace still run what the crashed process
	// left (and, with the local backend, what a restarted owner ended
	// already): ended all at once.
	failed := o.kill(ctx, replaced...)
	for _, id := range replaced {
		if err := failed[id]; err != nil {
			o.log.Warn("stop the sandbox a restore replaces; it is kept", "session", by[id], "sandbox", id, "err", err)
			continue // kept: its launch folders still name what runs
		}
		o.removeUnused(ctx, nil, id)
	}
	return nil
}

// installOne makes the session of a forked record current and returns the
// sandboxes it replaces: the one the record was exported from, and the
// sandbox of a session of this process with the same id.
func (o *Owner) installOne(in *install) []string {
	next := in.rec.EpisodeID.Next()
	s := &session{
		id: in.rec.SessionID, secret: in.secret, body: in.body, raw: in.rec.State.RunBody,
		sandboxID: in.fork.ID(), workdir: in.fork.Workdir(), generation: in.gen,
		snapshots: map[string]string{},
		bound:     true, episode: next, restored: true,
	}
	o.mu.Lock()
	old := o.sessions[s.id]
	o.sessions[s.id] = s
	o.byKey[next.CaptureKey()] = s
	o.mu.Unlock()
	candidates := []string{in.rec.State.SandboxID}
	if old != nil {
		old.mu.Lock()
		candidates = append(candidates, old.sandboxID)
		old.closed = true
		old.mu.Unlock()
	}
	var replaced []string
	for _, id := range candidates {
		if id != "" && id != s.sandboxID && !slices.Contains(replaced, id) {
			replaced = append(replaced, id)
		}
	}
	o.log.Info("session restored", "session", s.id, "key", next.CaptureKey(),
		"snapshot", in.rec.State.Snapshot, "old_sandbox", in.rec.State.SandboxID, "sandbox", s.sandboxID)
	return replaced
}

// RestoredPending implements gym.RestoredKeeper: the attempts whose
// restored session no call has used yet.
func (o *Owner) RestoredPending(ctx context.Context) ([]gym.EpisodeID, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []gym.EpisodeID
	for _, s := range o.byKey {
		if s.restored && !s.retired {
			out = append(out, s.episode)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CaptureKey() < out[j].CaptureKey() })
	return out, nil
}

// DeleteRestored implements gym.RestoredKeeper: the restored session of
// id is removed with its sandbox, leaving nothing that refuses the
// attempt (a later seed of it starts fresh).
func (o *Owner) DeleteRestored(ctx context.Context, id gym.EpisodeID) error {
	o.ckMu.Lock()
	defer o.ckMu.Unlock()
	o.mu.Lock()
	s := o.byKey[id.CaptureKey()]
	if s == nil || !s.restored {
		o.mu.Unlock()
		return nil
	}
	o.mu.Unlock()
	if err := o.free(ctx, s); err != nil {
		return fmt.Errorf("owner: delete the restored session of %s: %w", id.CaptureKey(), err)
	}
	o.mu.Lock()
	if o.byKey[id.CaptureKey()] == s {
		delete(o.byKey, id.CaptureKey())
	}
	if o.sessions[s.id] == s {
		delete(o.sessions, s.id)
	}
	o.mu.Unlock()
	return nil
}

// free stops and removes the session's sandbox and closes it. The snapshot
// stays: a checkpoint may still refer to it.
func (o *Owner) free(ctx context.Context, s *session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sandboxID != "" {
		if err := o.stop(ctx, s.sandboxID); err != nil {
			return fmt.Errorf("stop sandbox %s: %w", s.sandboxID, err)
		}
		if err := o.opt.Sandboxes.Remove(ctx, s.sandboxID); err != nil {
			return fmt.Errorf("remove sandbox %s: %w", s.sandboxID, err)
		}
		o.log.Info("sandbox freed", "session", s.id, "sandbox", s.sandboxID)
		s.sandboxID = ""
	}
	s.closed = true
	return nil
}

// retiring lists the sessions bound to id's rollout at attempt <= id's,
// marking them retired.
func (o *Owner) retiring(id gym.EpisodeID) []*session {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*session
	for _, s := range o.byKey {
		if s.episode.RolloutID == id.RolloutID && s.episode.Attempt <= id.Attempt {
			s.retired = true
			out = append(out, s)
		}
	}
	return out
}

// Retire implements gym.Participant: the sessions of id's rollout at
// attempts <= id.Attempt are refused from now on (gym.ErrStaleAttempt, a
// close excepted), their calls in flight are waited for (a seed in flight
// too: the session it makes is freed as well), then each sandbox is stopped
// and removed. A session whose freeing failed, or was cut short by ctx,
// stays tracked as a blocker until a retried Retire frees it.
func (o *Owner) Retire(ctx context.Context, id gym.EpisodeID) error {
	o.ckMu.Lock()
	defer o.ckMu.Unlock()
	o.retiring(id)
	for {
		o.mu.Lock()
		busy := false
		for ep, n := range o.requests {
			if n > 0 && ep.RolloutID == id.RolloutID && ep.Attempt <= id.Attempt {
				busy = true
			}
		}
		changed := o.changed
		o.mu.Unlock()
		if !busy {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("owner: retire %s: waiting for its calls in flight: %w", id.CaptureKey(), ctx.Err())
		}
	}
	var errs []error
	for _, s := range o.retiring(id) {
		if err := o.free(ctx, s); err != nil {
			errs = append(errs, fmt.Errorf("session %s: %w", s.id, err))
			continue
		}
		o.mu.Lock()
		s.freed = true
		delete(o.byKey, s.episode.CaptureKey())
		o.mu.Unlock()
		o.log.Info("session retired", "session", s.id, "key", s.episode.CaptureKey())
	}
	o.notify()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("owner: retire %s: %w", id.CaptureKey(), err)
	}
	return nil
}

// ParkExported implements gym.Participant: once a commit with stop is
// durable, the sandboxes of the sessions it exported are stopped and
// removed (the snapshots stay; a restore rebuilds them). Their sessions
// then refuse calls with gym.ErrCheckpointParked.
func (o *Owner) ParkExported(ctx context.Context, records []gym.Record) error {
	o.ckMu.Lock()
	defer o.ckMu.Unlock()
	var errs []error
	for _, r := range records {
		var rec Record
		if err := r.Decode(&rec); err != nil {
			errs = append(errs, err)
			continue
		}
		o.mu.Lock()
		s := o.sessions[rec.SessionID]
		if s != nil && (!s.bound || s.episode != rec.EpisodeID) {
			s = nil
		}
		o.mu.Unlock()
		if s == nil {
			continue
		}
		s.mu.Lock()
		if s.sandboxID != "" && !s.closed {
			if err := o.stop(ctx, s.sandboxID); err != nil {
				errs = append(errs, fmt.Errorf("session %s: stop sandbox %s: %w", s.id, s.sandboxID, err))
			} else if err := o.opt.Sandboxes.Remove(ctx, s.sandboxID); err != nil {
				errs = append(errs, fmt.Errorf("session %s: remove sandbox %s: %w", s.id, s.sandboxID, err))
			} else {
				o.log.Info("sandbox parked for the stop", "session", s.id, "sandbox", s.sandboxID)
				s.sandboxID, s.parked = "", true
			}
		}
		s.mu.Unlock()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("owner: park the exported sandboxes: %w", err)
	}
	return nil
}
