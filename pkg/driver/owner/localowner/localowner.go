// Package localowner is the embedded local sandbox owner: owner.Owner on
// top of the local sandbox backend, so `ngdriver run` works with no other
// server. With Options.Sandboxes it lends the sandboxes of any backend that
// can create, snapshot, fork and remove them (OpenSandbox, docker,
// kubectl) the same way.
//
// Sessions are bound to the attempt a call names by its capture key (the
// /ng-rollout/<key>/ prefix of Gym's resources servers): a seed for a key
// whose session exists answers that session again. The Owner is also
// Gym's resources checkpoint participant (gym.Participant of kind
// "resources", checkpoint.go): at a commit it snapshots the sandbox of
// every open session in scope and exports a record per session, at a
// restore (in a fresh process too) it forks each snapshot into a new
// sandbox bound to the next attempt's key, and retire frees an attempt's
// sessions. While a checkpoint has admission closed, session calls wait
// for it to reopen (CloseAdmission). The older in-process checkpoint side (Snapshot, Restore,
// RetireCheckpoint by checkpoint id) remains for `ngdriver run`.
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
// Sessions live in memory: an Owner forgets them when its process ends; a
// checkpoint's records and snapshots are what a restore brings back.
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
	"github.com/ngharness/ngharness/pkg/gym"
)

// CookieName is the cookie that names a session. Gym's resources servers
// name their session cookie after the server (<ServerClass>___<name>); a
// caller sends back every cookie the seed reply set, so the name is ours
// to keep stable.
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

	mu       sync.Mutex // guards sessions, byKey and the admission state below
	sessions map[string]*session
	byKey    map[string]*session // capture key -> the attempt's session

	accepting    bool
	opened       chan struct{}         // closed while admission is open
	inflight     int                   // calls a checkpoint waits for
	requests     map[gym.EpisodeID]int // calls in flight per attempt, which a retire waits for
	changed      chan struct{}         // closed and replaced when a call ends
	checkpointID string                // of the last CloseAdmission
	ending       []*session            // verified during a checkpoint; they end when admission reopens
	control      *gym.Control

	// ckMu serializes the checkpoint side (Snapshot, Restore, Retire) and
	// guards checkpoints. Lock order: ckMu, then a session's mu, then mu.
	ckMu        sync.Mutex
	checkpoints map[string]map[string]string // checkpoint id -> session id -> snapshot id
}

var _ owner.Owner = (*Owner)(nil)

// session is one rollout's session. mu serializes the calls on it and
// guards the fields up to snapshots; the binding fields after it are
// guarded by Owner.mu.
type session struct {
	mu         sync.Mutex
	id         string
	body       runBody
	raw        json.RawMessage // the run body as the seed sent it
	sandboxID  string          // "" when no sandbox is lent
	workdir    string
	generation int // the n of the current sandbox sb-<session>-<n>
	closed     bool
	verified   bool
	parked     bool              // its sandbox was removed after a commit with stop
	failed     bool              // the seed that made it failed; it is not registered
	snapshots  map[string]string // checkpoint id -> snapshot id
	exported   []string          // checkpoint ids of the exports, oldest first (KeptSnapshots kept)

	// Guarded by Owner.mu.
	bound    bool          // seeded under a capture key
	episode  gym.EpisodeID // the attempt the key names
	restored bool          // installed by a restore, not used by any call yet
	retired  bool          // its attempt was retired: calls are refused
	freed    bool          // a retire freed it
}

// capturable reports whether a checkpoint can capture the session: it
// lends a sandbox and its body does not ask to restart.
func (s *session) capturable() bool { return !s.body.Restart && !s.body.NoSandbox }

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
	// Key is the capture key the session is bound to ("" when its seed
	// named none); Restored says a restore installed it and no call has
	// used it yet.
	Key      string `json:"key,omitempty"`
	Restored bool   `json:"restored,omitempty"`
}

// New returns an owner on opt.Sandboxes (or the local opt.Backend). It
// panics without either (a programming error). A snapshot the owner drops
// while a sandbox made from it still uses it is kept and removed once that
// sandbox is gone (KeptInUse).
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
	// A snapshot a fork still uses is kept and removed later (inuse.go).
	opt.Sandboxes = keepInUseOf(opt.Sandboxes, log.With("owner", "local"))
	opened := make(chan struct{})
	close(opened)
	return &Owner{opt: opt, log: log.With("owner", "local"),
		sessions: map[string]*session{}, byKey: map[string]*session{},
		accepting: true, opened: opened, requests: map[gym.EpisodeID]int{}, changed: make(chan struct{}),
		checkpoints: map[string]map[string]string{}}
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
//
// key is the attempt's capture key ("" for a caller that names none): the
// session is bound to it, and a later seed for the same key answers the
// same session (its cookies) again, or owner.ErrClosed once it ended. After
// a restore the next attempt's key names the fork of the snapshot, so its
// seed continues the session instead of making a fresh sandbox. A key of a
// retired attempt is refused with gym.ErrStaleAttempt; while a checkpoint
// has admission closed the seed waits for it to reopen.
func (o *Owner) SeedSession(ctx context.Context, key string, body json.RawMessage) (owner.SeedReply, error) {
	return o.SeedSessionWith(ctx, key, nil, body)
}

// SeedSessionWith is SeedSession for a caller that sends cookies with the
// seed (as an HTTP client's cookie jar does). Without a key, when they name
// a closed session the seed is refused with owner.ErrClosed and nothing is
// created (a late seed must not recreate a closed session); when they name
// an open session, its seed reply is returned again. With a key, the key
// decides.
func (o *Owner) SeedSessionWith(ctx context.Context, key string, c owner.Cookies, body json.RawMessage) (owner.SeedReply, error) {
	rb, err := parseRunBody(body)
	if err != nil {
		return owner.SeedReply{}, err
	}
	id, bound, err := attemptOf(key)
	if err != nil {
		return owner.SeedReply{}, err
	}
	done, err := o.admit(ctx, admission{call: callSeed, id: id, bound: bound})
	if err != nil {
		return owner.SeedReply{}, err
	}
	defer done()

	s := &session{id: newSessionID(), body: rb, raw: append(json.RawMessage(nil), body...), snapshots: map[string]string{}}
	s.mu.Lock() // held until the sandbox exists: a concurrent seed of the key waits for it
	defer s.mu.Unlock()
	o.mu.Lock()
	existing := o.byKey[key]
	if !bound {
		existing = o.sessions[c[CookieName]]
	}
	if existing == nil && bound {
		s.bound, s.episode = true, id
		o.byKey[key] = s
	}
	o.mu.Unlock()
	if existing != nil {
		return o.seedAgain(existing)
	}
	if err := ctx.Err(); err != nil {
		o.unregister(s)
		return owner.SeedReply{}, err
	}
	if !rb.NoSandbox {
		sb, err := o.newSandbox(ctx, sandboxID(s.id, 0), rb.Files)
		if err != nil {
			o.unregister(s)
			return owner.SeedReply{}, fmt.Errorf("localowner: seed session %s: %w", s.id, err)
		}
		s.sandboxID, s.workdir = sb.ID(), sb.Workdir()
	}
	o.mu.Lock()
	o.sessions[s.id] = s
	o.mu.Unlock()
	o.log.Info("session seeded", "session", s.id, "key", key, "rollout", rb.RolloutID, "sandbox", s.sandboxID,
		"restart", rb.Restart, "no_sandbox", rb.NoSandbox)
	return s.seedReply()
}

// seedAgain answers a seed for a session that exists: its reply again, or
// owner.ErrClosed once it ended.
func (o *Owner) seedAgain(s *session) (owner.SeedReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed {
		return owner.SeedReply{}, fmt.Errorf("localowner: seed for session %s: a concurrent seed of the same attempt failed", s.id)
	}
	if s.closed {
		return owner.SeedReply{}, fmt.Errorf("localowner: seed for session %s: %w", s.id, owner.ErrClosed)
	}
	o.mu.Lock()
	retired := s.retired
	if !retired {
		s.restored = false
	}
	o.mu.Unlock()
	if retired {
		return owner.SeedReply{}, gym.Refuse(gym.ErrStaleAttempt, "resources session %s belongs to a retired attempt", s.id)
	}
	return s.seedReply()
}

// unregister drops a session whose seed failed (s.mu held).
func (o *Owner) unregister(s *session) {
	s.failed = true
	o.mu.Lock()
	if s.bound && o.byKey[s.episode.CaptureKey()] == s {
		delete(o.byKey, s.episode.CaptureKey())
	}
	o.mu.Unlock()
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

// lookup returns the session a call names: the one its cookies name, else
// the one bound to its key.
func (o *Owner) lookup(key string, c owner.Cookies) (*session, error) {
	id := c[CookieName]
	o.mu.Lock()
	s := o.sessions[id]
	if id == "" && key != "" {
		s = o.byKey[key]
		if s != nil && s.failed {
			s = nil
		}
	}
	o.mu.Unlock()
	switch {
	case s != nil:
		return s, nil
	case id == "" && key != "":
		return nil, fmt.Errorf("localowner: %w: no %s cookie and no session of attempt %q", ErrUnknownSession, CookieName, key)
	case id == "":
		return nil, fmt.Errorf("localowner: %w: no %s cookie", ErrUnknownSession, CookieName)
	}
	return nil, fmt.Errorf("localowner: %w: %q", ErrUnknownSession, id)
}

// enter finds the session of a call and admits the call (see admit).
func (o *Owner) enter(ctx context.Context, call, key string, c owner.Cookies) (*session, func(), error) {
	id, bound, err := attemptOf(key)
	if err != nil {
		return nil, nil, err
	}
	s, err := o.lookup(key, c)
	if err != nil {
		return nil, nil, err
	}
	if !bound {
		o.mu.Lock()
		id, bound = s.episode, s.bound
		o.mu.Unlock()
	}
	done, err := o.admit(ctx, admission{call: call, id: id, bound: bound, s: s})
	if err != nil {
		return nil, nil, err
	}
	return s, done, nil
}

// SandboxAccess says which sandbox the session uses now: after a restore,
// the fork. A closed session is owner.ErrClosed; one that lends no sandbox
// is owner.ErrNoSandbox.
func (o *Owner) SandboxAccess(ctx context.Context, key string, c owner.Cookies) (owner.Access, error) {
	s, done, err := o.enter(ctx, callAccess, key, c)
	if err != nil {
		return owner.Access{}, err
	}
	defer done()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return owner.Access{}, err
	}
	if s.closed {
		return owner.Access{}, fmt.Errorf("localowner: session %s: %w", s.id, owner.ErrClosed)
	}
	if s.sandboxID == "" {
		return owner.Access{}, fmt.Errorf("localowner: session %s: %w", s.id, owner.ErrNoSandbox)
	}
	var a owner.Access
	a.Connection.Kind = "direct"
	a.Connection.ProviderConfigRef = o.opt.Sandboxes.Name()
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
// open. A verify that replays and ran while a checkpoint has admission
// closed leaves the session open until admission reopens, so the
// checkpoint still exports it.
func (o *Owner) Verify(ctx context.Context, key string, c owner.Cookies, body json.RawMessage) (owner.VerifyReply, error) {
	req, err := parseObject("verify body", body)
	if err != nil {
		return owner.VerifyReply{}, err
	}
	s, done, err := o.enter(ctx, callVerify, key, c)
	if err != nil {
		return owner.VerifyReply{}, err
	}
	defer done()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return owner.VerifyReply{}, err
	}
	if s.closed {
		return owner.VerifyReply{}, fmt.Errorf("localowner: verify session %s: %w", s.id, owner.ErrClosed)
	}

	reply := owner.VerifyReply{Reward: 1}
	if s.body.Check != "" {
		var res sandbox.ExecResult
		var err error
		if s.body.VerifyMode == "replay" {
			// A verify that may run again holds up no checkpoint (Gym's
			// resources.py leaves it out of what a prepare waits for): the
			// session is let go while its check runs, so a commit can
			// snapshot the sandbox meanwhile.
			sandboxID := s.sandboxID
			s.mu.Unlock()
			res, err = o.runCheckIn(ctx, s, sandboxID)
			s.mu.Lock()
		} else {
			res, err = o.runCheck(ctx, s)
		}
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

	o.log.Info("session verified", "session", s.id, "reward", reply.Reward, "failure_kind", reply.FailureKind)
	if o.endAtReopen(s) {
		return reply, nil
	}
	o.endVerified(ctx, s)
	return reply, nil
}

// endVerified ends a verified session: its sandbox is stopped (a failure
// is logged, the verdict stands) and it is marked closed and verified
// (s.mu held).
func (o *Owner) endVerified(ctx context.Context, s *session) {
	if err := o.stop(ctx, s.sandboxID); err != nil {
		o.log.Warn("stop the sandbox of a verified session", "session", s.id, "sandbox", s.sandboxID, "err", err)
	}
	s.closed, s.verified = true, true
	o.removeUnused(ctx, s.sandboxID)
}

// runCheck runs the session's check (s.mu held).
func (o *Owner) runCheck(ctx context.Context, s *session) (sandbox.ExecResult, error) {
	return o.runCheckIn(ctx, s, s.sandboxID)
}

// runCheckIn runs the session's check in sandboxID ("" for a scratch
// sandbox with the body's files); it reads only the session's fields that
// never change (its id and body).
func (o *Owner) runCheckIn(ctx context.Context, s *session, sandboxID string) (sandbox.ExecResult, error) {
	var sb sandbox.Sandbox
	if sandboxID != "" {
		var err error
		if sb, err = o.opt.Sandboxes.Open(ctx, sandboxID); err != nil {
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
// and the session marked closed. Idempotent: closing a closed session (or
// one a retire or a stop freed) does nothing; a close is never refused as
// stale. If the sandbox cannot be stopped the error is returned and the
// session stays open, so the close can be retried.
func (o *Owner) CloseSession(ctx context.Context, key string, c owner.Cookies) error {
	s, done, err := o.enter(ctx, callClose, key, c)
	if err != nil {
		return err
	}
	defer done()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.parked {
		s.closed = true
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
	s, err := o.lookup("", c)
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
	o.mu.Lock()
	if s.bound {
		info.Key = s.episode.CaptureKey()
	}
	info.Restored = s.restored
	o.mu.Unlock()
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

// forEach runs fn on every item, at most parallelism at once, and joins
// the errors.
func forEach[T any](items []T, fn func(T) error) error {
	errs := make([]error, len(items))
	sem := make(chan struct{}, parallelism)
	var wg sync.WaitGroup
	for i, s := range items {
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
		fork, gen, err := o.forkNext(ctx, snap, s.id, s.generation)
		if err != nil {
			return fmt.Errorf("session %s: %w", s.id, err)
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

// RetireCheckpoint removes the checkpoint's snapshots (the in-process
// side; gym's Retire frees an attempt). Retiring a checkpoint with no
// snapshots (or one retired already) does nothing. A snapshot that could
// not be removed stays recorded, so a later call tries again.
func (o *Owner) RetireCheckpoint(ctx context.Context, checkpointID string) error {
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

// forkNext forks the snapshot into the first free sandbox name
// sb-<session>-<n> after generation (a restore that failed half way may
// have left a name taken) and returns the fork and its n.
func (o *Owner) forkNext(ctx context.Context, snap, sessionID string, generation int) (sandbox.Sandbox, int, error) {
	for gen := generation + 1; ; gen++ {
		name := sandboxID(sessionID, gen)
		if gen <= generation+100 {
			if _, err := o.opt.Sandboxes.Open(ctx, name); err == nil {
				continue
			}
		}
		fork, err := o.opt.Sandboxes.Fork(ctx, snap, name)
		if err == nil {
			return fork, gen, nil
		}
		if !errors.Is(err, local.ErrExists) || gen > generation+100 {
			return nil, 0, err
		}
	}
}
