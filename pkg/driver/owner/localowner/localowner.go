// Package localowner is the embedded local sandbox owner: owner.Owner on
// top of the local sandbox backend, so `ngdriver run` works with no other
// server. With Options.Sandboxes it lends the sandboxes of any backend that
// can create, snapshot, fork and remove them (OpenSandbox, docker,
// kubectl) the same way. It is also a checkpoint participant: at a commit
// it snapshots the sandbox of every open session, at a restore it forks
// each snapshot under a new sandbox id and makes the session current on
// the fork, and at retire it removes the snapshots.
//
// The run body of its tasks (JSON; fields it does not know are kept):
//
//	{"rollout_id": "...",
//	 "task": "text given to the harness (never executed by the owner)",
//	 "check": "shell command run in the workdir at verify; exit 0 = reward 1",
//	 "files": {"relative/path": "content", ...},   written into the workdir at seed
//	 "restart": false,      answer with the restart header (the owner "cannot capture" this session)
//	 "no_sandbox": false,   lend no sandbox (SandboxAccess returns owner.ErrNoSandbox)
//	 "verify_mode": ""}     "" or "replay"
//
// Sessions live in memory: an Owner forgets them when its process ends.
package localowner

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// CookieName is the cookie that names a session.
const CookieName = "session_id"

// DefaultCheckTimeout bounds a verify's check when Options.CheckTimeout is 0.
const DefaultCheckTimeout = 10 * time.Minute

// Failure kinds a verify reports.
const (
	// FailureCheckFailed: the check exited non-zero.
	FailureCheckFailed = "check_failed"
	// FailureCheckTimeout: the check ran out of time.
	FailureCheckTimeout = "check_timeout"
)

// parallelism bounds the sandboxes copied at once by Snapshot and Restore.
const parallelism = 8

// ErrUnknownSession means the cookies name no session of this owner (or no
// session at all).
var ErrUnknownSession = errors.New("unknown session")

// ErrUnknownCheckpoint means the owner took no snapshot under that
// checkpoint id (or retired it).
var ErrUnknownCheckpoint = errors.New("unknown checkpoint")

// Options configure an Owner.
type Options struct {
	// Backend keeps the sandboxes: the local backend. Required unless
	// Sandboxes is set.
	Backend *local.Backend
	// Sandboxes lends the sandboxes of any backend that can create,
	// snapshot, fork and remove them (OpenSandbox, docker, kubectl); nil:
	// Local(Backend).
	Sandboxes Sandboxes
	// StopSandbox ends every process of a sandbox (the driver passes a
	// function that runs `ngsup stop` on each launch folder); nil: no
	// process is stopped.
	StopSandbox func(ctx context.Context, sb sandbox.Sandbox) error
	// KillSandbox ends every process of a sandbox a restore replaces, at
	// once: its processes belong to a run that crashed. Nil: StopSandbox.
	KillSandbox func(ctx context.Context, sb sandbox.Sandbox) error
	// Logger receives what the owner did and what went wrong (nil:
	// slog.Default()).
	Logger *slog.Logger
	// CheckTimeout bounds the check a verify runs (0: DefaultCheckTimeout).
	CheckTimeout time.Duration
	// RemoveUnused removes a session's sandbox once nothing uses it: when
	// the session closes (verify or close), and the sandbox a restore
	// replaced. By default they are kept for inspection.
	RemoveUnused bool
}

// Owner is the embedded local owner. Its methods are safe for concurrent
// use by many runs.
type Owner struct {
	opt Options
	log *slog.Logger

	mu       sync.Mutex // guards sessions
	sessions map[string]*session

	// ckMu serializes the checkpoint side (Snapshot, Restore, Retire) and
	// guards checkpoints. Lock order: ckMu, then a session's mu, then mu.
	ckMu        sync.Mutex
	checkpoints map[string]map[string]string // checkpoint id -> session id -> snapshot id
}

var _ owner.Owner = (*Owner)(nil)

// session is one rollout's session. mu serializes the calls on it.
type session struct {
	mu         sync.Mutex
	id         string
	body       runBody
	sandboxID  string // "" when no sandbox is lent
	workdir    string
	generation int // the n of the current sandbox sb-<session>-<n>
	closed     bool
	verified   bool
	snapshots  map[string]string // checkpoint id -> snapshot id
}

// SessionInfo describes a session, for tests and the CLI.
type SessionInfo struct {
	// SessionID is the session's id (its cookie).
	SessionID string `json:"session_id"`
	// RolloutID is the run body's rollout_id.
	RolloutID string `json:"rollout_id,omitempty"`
	// SandboxID is the current sandbox ("" when none is lent); Workdir is
	// its workdir.
	SandboxID string `json:"sandbox_id,omitempty"`
	Workdir   string `json:"workdir,omitempty"`
	// Closed and Verified say how the session ended.
	Closed   bool `json:"closed"`
	Verified bool `json:"verified"`
	// Restart and NoSandbox are the run body's flags.
	Restart   bool `json:"restart,omitempty"`
	NoSandbox bool `json:"no_sandbox,omitempty"`
	// Snapshots maps checkpoint id to the snapshot taken of the session.
	Snapshots map[string]string `json:"snapshots,omitempty"`
}

// New returns an owner on opt.Sandboxes (or the local opt.Backend). It
// panics without either (a programming error).
func New(opt Options) *Owner {
	if opt.Sandboxes == nil {
		if opt.Backend == nil {
			panic("localowner: Options.Backend and Options.Sandboxes are nil")
		}
		opt.Sandboxes = Local(opt.Backend)
	}
	if opt.CheckTimeout <= 0 {
		opt.CheckTimeout = DefaultCheckTimeout
	}
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Owner{opt: opt, log: log.With("owner", "local"),
		sessions: map[string]*session{}, checkpoints: map[string]map[string]string{}}
}

func newSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func sandboxID(sessionID string, generation int) string {
	return fmt.Sprintf("sb-%s-%d", sessionID, generation)
}

// SeedSession starts a session for a run body: a new session id (cookie
// session_id), a new sandbox sb-<session>-0 with the body's files in its
// workdir, and the reply body {"sandbox_handle", "workdir"}. Restart and
// VerifyMode come from the body. A body that is not a JSON object, or whose
// known fields have the wrong type, is an error and creates nothing.
func (o *Owner) SeedSession(ctx context.Context, key string, body json.RawMessage) (owner.SeedReply, error) {
	return o.SeedSessionWith(ctx, key, nil, body)
}

// SeedSessionWith is SeedSession for a caller that sends cookies with the
// seed (as an HTTP client's cookie jar does): when they name a closed
// session the seed is refused with owner.ErrClosed and nothing is created
// (a late seed must not recreate a closed session); when they name an open
// session, its seed reply is returned again.
func (o *Owner) SeedSessionWith(ctx context.Context, key string, c owner.Cookies, body json.RawMessage) (owner.SeedReply, error) {
	rb, err := parseRunBody(body)
	if err != nil {
		return owner.SeedReply{}, err
	}
	if id := c[CookieName]; id != "" {
		o.mu.Lock()
		s := o.sessions[id]
		o.mu.Unlock()
		if s != nil {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.closed {
				return owner.SeedReply{}, fmt.Errorf("localowner: seed for session %s: %w", id, owner.ErrClosed)
			}
			return s.seedReply()
		}
	}
	if err := ctx.Err(); err != nil {
		return owner.SeedReply{}, err
	}

	s := &session{id: newSessionID(), body: rb, snapshots: map[string]string{}}
	if !rb.NoSandbox {
		sb, err := o.newSandbox(ctx, sandboxID(s.id, 0), rb.Files)
		if err != nil {
			return owner.SeedReply{}, fmt.Errorf("localowner: seed session %s: %w", s.id, err)
		}
		s.sandboxID, s.workdir = sb.ID(), sb.Workdir()
	}
	o.mu.Lock()
	o.sessions[s.id] = s
	o.mu.Unlock()
	o.log.Info("session seeded", "session", s.id, "rollout", rb.RolloutID, "sandbox", s.sandboxID,
		"restart", rb.Restart, "no_sandbox", rb.NoSandbox)
	return s.seedReply()
}

// newSandbox creates a sandbox with files in its workdir; on failure
// nothing is left.
func (o *Owner) newSandbox(ctx context.Context, id string, files map[string]string) (sandbox.Sandbox, error) {
	sb, err := o.opt.Sandboxes.Create(ctx, id)
	if err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := sb.Upload(ctx, filepath.Join(sb.Workdir(), filepath.Clean(p)), []byte(files[p]), 0o644); err != nil {
			if rerr := o.opt.Sandboxes.Remove(context.WithoutCancel(ctx), sb.ID()); rerr != nil {
				o.log.Warn("remove a half-seeded sandbox", "sandbox", sb.ID(), "err", rerr)
			}
			return nil, fmt.Errorf("write %s: %w", p, err)
		}
	}
	return sb, nil
}

// seedReply is the session's seed reply (s.mu held).
func (s *session) seedReply() (owner.SeedReply, error) {
	reply := map[string]string{}
	if s.sandboxID != "" {
		reply["sandbox_handle"] = s.sandboxID
		reply["workdir"] = s.workdir
	}
	b, err := json.Marshal(reply)
	if err != nil {
		return owner.SeedReply{}, err
	}
	return owner.SeedReply{
		Cookies:    owner.Cookies{CookieName: s.id},
		Restart:    s.body.Restart,
		VerifyMode: s.body.VerifyMode,
		Body:       b,
	}, nil
}

// lookup returns the session the cookies name.
func (o *Owner) lookup(c owner.Cookies) (*session, error) {
	id := c[CookieName]
	if id == "" {
		return nil, fmt.Errorf("localowner: %w: no %s cookie", ErrUnknownSession, CookieName)
	}
	o.mu.Lock()
	s := o.sessions[id]
	o.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("localowner: %w: %q", ErrUnknownSession, id)
	}
	return s, nil
}

// SandboxAccess says which sandbox the session uses now: after a restore,
// the fork. A closed session is owner.ErrClosed; one that lends no sandbox
// is owner.ErrNoSandbox.
func (o *Owner) SandboxAccess(ctx context.Context, key string, c owner.Cookies) (owner.Access, error) {
	s, err := o.lookup(c)
	if err != nil {
		return owner.Access{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return owner.Access{}, fmt.Errorf("localowner: session %s: %w", s.id, owner.ErrClosed)
	}
	if s.sandboxID == "" {
		return owner.Access{}, fmt.Errorf("localowner: session %s: %w", s.id, owner.ErrNoSandbox)
	}
	var a owner.Access
	a.Connection.Kind = "direct"
	a.Connection.Descriptor = sandbox.Descriptor{Provider: o.opt.Sandboxes.Name(), SandboxID: s.sandboxID, Workdir: s.workdir}
	a.Workdir = s.workdir
	return a, nil
}

// Verify grades the run: it runs the body's check (sh -c CHECK, in the
// workdir of the current sandbox; in a scratch sandbox holding the seed's
// files when the session lends none) and answers reward 1 when it exits 0,
// else 0 with failure_kind and failure_reason (naming the exit code and the
// tail of the check's output). A body without a check gets reward 1. The
// reply body is the request body plus those fields. Then the session ends:
// its sandbox is stopped (a failure to stop is logged, the verdict stands)
// and it is marked closed and verified. On a closed session: owner.ErrClosed.
// An error running the check (other than its timeout) leaves the session
// open.
func (o *Owner) Verify(ctx context.Context, key string, c owner.Cookies, body json.RawMessage) (owner.VerifyReply, error) {
	req, err := parseObject("verify body", body)
	if err != nil {
		return owner.VerifyReply{}, err
	}
	s, err := o.lookup(c)
	if err != nil {
		return owner.VerifyReply{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return owner.VerifyReply{}, fmt.Errorf("localowner: verify session %s: %w", s.id, owner.ErrClosed)
	}

	reply := owner.VerifyReply{Reward: 1}
	if s.body.Check != "" {
		res, err := o.runCheck(ctx, s)
		switch {
		case err != nil && errors.Is(err, sandbox.ErrTimeout) && ctx.Err() == nil:
			reply.Reward = 0
			reply.FailureKind = FailureCheckTimeout
			reply.FailureReason = fmt.Sprintf("the check %s did not finish within %s: %s", abbrev(s.body.Check), o.opt.CheckTimeout, outputTail(res))
		case err != nil:
			return owner.VerifyReply{}, fmt.Errorf("localowner: verify session %s: run the check: %w", s.id, err)
		case res.ExitCode != 0:
			reply.Reward = 0
			reply.FailureKind = FailureCheckFailed
			reply.FailureReason = fmt.Sprintf("the check %s exited with code %d: %s", abbrev(s.body.Check), res.ExitCode, outputTail(res))
		}
	}

	out := make(map[string]any, len(req)+4)
	for k, v := range req {
		out[k] = v
	}
	out["reward"] = reply.Reward
	out["mask_sample"] = reply.MaskSample
	delete(out, "failure_kind")
	delete(out, "failure_reason")
	if reply.FailureKind != "" {
		out["failure_kind"] = reply.FailureKind
		out["failure_reason"] = reply.FailureReason
	}
	if reply.Body, err = json.Marshal(out); err != nil {
		return owner.VerifyReply{}, fmt.Errorf("localowner: verify session %s: %w", s.id, err)
	}

	if err := o.stop(ctx, s.sandboxID); err != nil {
		o.log.Warn("stop the sandbox of a verified session", "session", s.id, "sandbox", s.sandboxID, "err", err)
	}
	s.closed, s.verified = true, true
	o.removeUnused(ctx, s.sandboxID)
	o.log.Info("session verified", "session", s.id, "reward", reply.Reward, "failure_kind", reply.FailureKind)
	return reply, nil
}

// runCheck runs the session's check (s.mu held).
func (o *Owner) runCheck(ctx context.Context, s *session) (sandbox.ExecResult, error) {
	var sb sandbox.Sandbox
	if s.sandboxID != "" {
		var err error
		if sb, err = o.opt.Sandboxes.Open(ctx, s.sandboxID); err != nil {
			return sandbox.ExecResult{}, err
		}
	} else {
		id := fmt.Sprintf("sb-%s-check-%s", s.id, newSessionID()[:8])
		var err error
		if sb, err = o.newSandbox(ctx, id, s.body.Files); err != nil {
			return sandbox.ExecResult{}, err
		}
		defer func() {
			if err := o.opt.Sandboxes.Remove(context.WithoutCancel(ctx), sb.ID()); err != nil {
				o.log.Warn("remove the scratch sandbox of a check", "sandbox", sb.ID(), "err", err)
			}
		}()
	}
	return sb.Exec(ctx, sandbox.ExecRequest{
		Argv:    []string{"sh", "-c", s.body.Check},
		Dir:     sb.Workdir(),
		Timeout: o.opt.CheckTimeout,
	})
}

func abbrev(s string) string {
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// outputTail is the end of the check's stderr (stdout when stderr is
// empty), for a failure reason.
func outputTail(res sandbox.ExecResult) string {
	out := strings.TrimSpace(string(res.Stderr))
	what := "stderr"
	if out == "" {
		out = strings.TrimSpace(string(res.Stdout))
		what = "stdout"
	}
	if out == "" {
		return "no output"
	}
	const n = 2048
	if len(out) > n {
		out = "..." + out[len(out)-n:]
	}
	return what + ": " + out
}

// stop ends every process of the sandbox id through Options.StopSandbox.
// A sandbox that is gone has none.
func (o *Owner) stop(ctx context.Context, id string) error {
	return o.end(ctx, id, o.opt.StopSandbox)
}

// kill ends every process of the sandbox id through Options.KillSandbox.
func (o *Owner) kill(ctx context.Context, id string) error {
	if o.opt.KillSandbox == nil {
		return o.stop(ctx, id)
	}
	return o.end(ctx, id, o.opt.KillSandbox)
}

func (o *Owner) end(ctx context.Context, id string, how func(context.Context, sandbox.Sandbox) error) error {
	if id == "" || how == nil {
		return nil
	}
	sb, err := o.opt.Sandboxes.Open(ctx, id)
	if errors.Is(err, sandbox.ErrGone) {
		return nil
	}
	if err != nil {
		return err
	}
	return how(ctx, sb)
}

func (o *Owner) removeUnused(ctx context.Context, id string) {
	if id == "" || !o.opt.RemoveUnused {
		return
	}
	if err := o.opt.Sandboxes.Remove(context.WithoutCancel(ctx), id); err != nil {
		o.log.Warn("remove an unused sandbox", "sandbox", id, "err", err)
	}
}

// CloseSession ends the session without a verdict: its sandbox is stopped
// and the session marked closed. Idempotent: closing a closed session does
// nothing. If the sandbox cannot be stopped the error is returned and the
// session stays open, so the close can be retried.
func (o *Owner) CloseSession(ctx context.Context, key string, c owner.Cookies) error {
	s, err := o.lookup(c)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if err := o.stop(ctx, s.sandboxID); err != nil {
		return fmt.Errorf("localowner: close session %s: stop sandbox %s: %w", s.id, s.sandboxID, err)
	}
	s.closed = true
	o.removeUnused(ctx, s.sandboxID)
	o.log.Info("session closed", "session", s.id)
	return nil
}

// Session describes the session the cookies name.
func (o *Owner) Session(c owner.Cookies) (SessionInfo, error) {
	s, err := o.lookup(c)
	if err != nil {
		return SessionInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	info := SessionInfo{
		SessionID: s.id, RolloutID: s.body.RolloutID,
		SandboxID: s.sandboxID, Workdir: s.workdir,
		Closed: s.closed, Verified: s.verified,
		Restart: s.body.Restart, NoSandbox: s.body.NoSandbox,
		Snapshots: make(map[string]string, len(s.snapshots)),
	}
	for k, v := range s.snapshots {
		info.Snapshots[k] = v
	}
	return info, nil
}

// snapshotID names the snapshot of a session at a checkpoint: readable
// (the checkpoint id, made a plain name) and unique (its hash).
func snapshotID(checkpointID, sessionID string) string {
	clean := []rune{}
	for _, r := range checkpointID {
		if len(clean) >= 48 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			clean = append(clean, r)
		} else {
			clean = append(clean, '_')
		}
	}
	sum := sha256.Sum256([]byte(checkpointID))
	return fmt.Sprintf("ck-%s-%s-%s", string(clean), hex.EncodeToString(sum[:4]), sessionID)
}

// forEach runs fn on every session, at most parallelism at once, and joins
// the errors.
func forEach(sessions []*session, fn func(*session) error) error {
	errs := make([]error, len(sessions))
	sem := make(chan struct{}, parallelism)
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = fn(s)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (o *Owner) allSessions() []*session {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]*session, 0, len(o.sessions))
	for _, s := range o.sessions {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// Snapshot snapshots the sandbox of every open session under the
// checkpoint (the caller has paused them) and returns session id ->
// snapshot id. Sessions snapshotted by an earlier call for the same
// checkpoint are not copied again, so a failed call can be retried; the
// map then holds every snapshot of the checkpoint, and the error names the
// sessions that failed.
func (o *Owner) Snapshot(ctx context.Context, checkpointID string) (map[string]string, error) {
	if checkpointID == "" {
		return nil, errors.New("localowner: snapshot: empty checkpoint id")
	}
	o.ckMu.Lock()
	defer o.ckMu.Unlock()
	taken := o.checkpoints[checkpointID]
	if taken == nil {
		taken = map[string]string{}
	}
	var mu sync.Mutex // guards taken while sessions are copied at once
	err := forEach(o.allSessions(), func(s *session) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed || s.sandboxID == "" {
			return nil
		}
		mu.Lock()
		_, done := taken[s.id]
		mu.Unlock()
		if done {
			return nil
		}
		start := time.Now()
		// A snapshot of that name left by a call that failed after
		// copying is taken again.
		snap, err := o.opt.Sandboxes.Snapshot(ctx, s.sandboxID, snapshotID(checkpointID, s.id))
		if err != nil {
			return fmt.Errorf("session %s: %w", s.id, err)
		}
		s.snapshots[checkpointID] = snap
		mu.Lock()
		taken[s.id] = snap
		mu.Unlock()
		o.log.Info("sandbox snapshotted", "checkpoint", checkpointID, "session", s.id,
			"sandbox", s.sandboxID, "snapshot", snap, "took", time.Since(start))
		return nil
	})
	if len(taken) > 0 {
		o.checkpoints[checkpointID] = taken
	}
	out := make(map[string]string, len(taken))
	for k, v := range taken {
		out[k] = v
	}
	if err != nil {
		return out, fmt.Errorf("localowner: snapshot for checkpoint %s: %w", checkpointID, err)
	}
	return out, nil
}

// Restore rewinds every session of the checkpoint to its snapshot: it
// stops the session's current sandbox (StopSandbox; a failure is logged,
// the old sandbox is abandoned either way), forks the snapshot under a NEW
// sandbox id (sb-<session>-<n+1>), makes the session current on the fork
// and reopens it (not closed, not verified). A checkpoint with no snapshots
// is ErrUnknownCheckpoint. The error names the sessions that could not be
// restored; the others are.
func (o *Owner) Restore(ctx context.Context, checkpointID string) error {
	o.ckMu.Lock()
	defer o.ckMu.Unlock()
	taken := o.checkpoints[checkpointID]
	if len(taken) == 0 {
		return fmt.Errorf("localowner: restore %q: %w", checkpointID, ErrUnknownCheckpoint)
	}
	var sessions []*session
	o.mu.Lock()
	for id := range taken {
		if s := o.sessions[id]; s != nil {
			sessions = append(sessions, s)
		}
	}
	o.mu.Unlock()
	err := forEach(sessions, func(s *session) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		snap := taken[s.id]
		old := s.sandboxID
		if err := o.kill(ctx, old); err != nil {
			o.log.Warn("stop the sandbox a restore replaces", "session", s.id, "sandbox", old, "err", err)
		}
		var fork sandbox.Sandbox
		gen := s.generation
		for {
			gen++
			name := sandboxID(s.id, gen)
			if gen <= s.generation+100 {
				if _, err := o.opt.Sandboxes.Open(ctx, name); err == nil {
					continue // the name is taken (a restore that failed half way)
				}
			}
			var err error
			fork, err = o.opt.Sandboxes.Fork(ctx, snap, name)
			if err == nil {
				break
			}
			if !errors.Is(err, local.ErrExists) || gen > s.generation+100 {
				return fmt.Errorf("session %s: %w", s.id, err)
			}
		}
		s.sandboxID, s.workdir, s.generation = fork.ID(), fork.Workdir(), gen
		s.closed, s.verified = false, false
		o.log.Info("session restored", "checkpoint", checkpointID, "session", s.id,
			"snapshot", snap, "old_sandbox", old, "sandbox", fork.ID())
		if old != fork.ID() {
			o.removeUnused(ctx, old)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("localowner: restore %s: %w", checkpointID, err)
	}
	return nil
}

// Retire removes the checkpoint's snapshots. Retiring a checkpoint with no
// snapshots (or one retired already) does nothing. A snapshot that could
// not be removed stays recorded, so a later Retire tries again.
func (o *Owner) Retire(ctx context.Context, checkpointID string) error {
	o.ckMu.Lock()
	defer o.ckMu.Unlock()
	taken := o.checkpoints[checkpointID]
	var errs []error
	ids := make([]string, 0, len(taken))
	for id := range taken {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		snap := taken[id]
		if err := o.opt.Sandboxes.RemoveSnapshot(ctx, snap); err != nil {
			errs = append(errs, fmt.Errorf("session %s: %w", id, err))
			continue
		}
		delete(taken, id)
		o.mu.Lock()
		s := o.sessions[id]
		o.mu.Unlock()
		if s != nil {
			s.mu.Lock()
			delete(s.snapshots, checkpointID)
			s.mu.Unlock()
		}
	}
	if len(taken) == 0 {
		delete(o.checkpoints, checkpointID)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("localowner: retire %s: %w", checkpointID, err)
	}
	return nil
}
