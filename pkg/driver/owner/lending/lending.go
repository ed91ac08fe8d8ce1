// Package lending is the sandbox owner ngharness brings: owner.Owner
// lending the sandboxes of any backend through its lending contract
// (sandbox.Lender: local, OpenSandbox, docker, kubectl), so `ngdriver run`
// works with no other server and `ngdriver owner serve` is Gym's resources
// server for them.
//
// Sessions are bound to the attempt a call names by its capture key (the
// /ng-rollout/<key>/ prefix of Gym's resources servers), and belong to
// whoever holds the cookie their seed set (see CookieName for the rule:
// every call on a session must carry it). The Owner is also
// Gym's resources checkpoint participant (gym.Participant of kind
// "resources", checkpoint.go): at a commit it snapshots the sandbox of
// every open session in scope and exports a record per session, at a
// restore (in a fresh process too) it forks each snapshot into a new
// sandbox bound to the next attempt's key, and retire frees an attempt's
// sessions. While a checkpoint has admission closed, session calls wait
// for it to reopen (CloseAdmission).
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
package lending

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
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

// CookieName is the cookie that names a session and proves its caller.
// Gym's resources servers name their session cookie after the server
// (<ServerClass>___<name>); a caller sends back every cookie the seed reply
// set, so the name is ours to keep stable.
//
// Its value is "<session id>.<secret>". The session id is no secret (it is
// in sandbox names, checkpoint records and logs, and a local sandbox sees
// the others' folders); the secret is 32 random bytes the seed makes, of
// which the owner keeps only the SHA-256 (in memory and in its checkpoint
// records). The rule:
//   - Every call on a session (sandbox_access, verify, close_session, with
//     or without the /ng-rollout/<key>/ prefix) must carry the cookie of
//     that session, compared in constant time. Without it, with a wrong
//     secret, or with the cookie of a session other than the key's, the
//     call is refused (ErrSessionCookie, which is gym.ErrUnauthorized: 401
//     unauthorized) and changes nothing.
//   - A seed for a key that has no session makes a new one, whatever
//     cookies it carries. A seed for a key whose session exists answers
//     that session again only when it carries the session's cookie;
//     without it the seed is refused (401) and hands out nothing. The one
//     exception is a session a restore installed that no call has claimed
//     yet: a driver whose checkpoint caught it before its seed reply never
//     had that cookie and seeds its next attempt again without one, so such
//     a seed replaces the restored session (its sandbox is removed) with a
//     fresh one. A caller with the cookie continues the restored session.
//   - A seed without a key answers the session its cookie proves again, and
//     otherwise makes a new session.
//
// A cookie without a '.' is one an owner before this rule wrote (it was the
// session id); it proves only a session restored from a record of that
// time, whose secret was its id.
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

// parallelism bounds the sandboxes copied at once by Export and Install.
const parallelism = 8

// Options configure an Owner.
type Options struct {
	// Backend keeps the sandboxes: the local backend. Required unless
	// Sandboxes is set.
	Backend *local.Backend
	// Sandboxes lends the sandboxes of any backend that can create,
	// snapshot, fork and remove them (local, OpenSandbox, docker, kubectl);
	// nil: Backend.Lender().
	Sandboxes sandbox.Lender
	// StopSandbox ends every process of a sandbox (the driver passes a
	// function that runs `ngsup stop` on each launch folder); nil: no
	// process is stopped.
	StopSandbox func(ctx context.Context, sb sandbox.Sandbox) error
	// KillSandbox ends every process of a sandbox a restore replaces, at
	// once: its processes belong to a run that crashed. Nil: StopSandbox.
	// Local sandboxes with namespace isolation are ended by the backend
	// instead, by the mount namespace their processes run in (see kill).
	KillSandbox func(ctx context.Context, sb sandbox.Sandbox) error
	// Logger receives what the owner did and what went wrong (nil:
	// slog.Default()).
	Logger *slog.Logger
	// CheckTimeout bounds the check a verify runs (0: DefaultCheckTimeout).
	CheckTimeout time.Duration
	// RemoveUnused removes a session's sandbox once nothing uses it: when
	// the session ends (its verify, or a close), and the sandbox a restore
	// replaced. A sandbox is removed only once every process of it was
	// ended (StopSandbox, or KillSandbox for a replaced one, succeeded): one
	// that could not be stopped is kept, with a warning. Its snapshots are
	// not touched (they are copies; checkpoint.go decides when they go).
	// False keeps every sandbox for inspection (`ngdriver owner serve
	// --keep-sandboxes`); the owner serve default is true.
	RemoveUnused bool
	// KeepFailed, with RemoveUnused, keeps the sandbox of a session that
	// ends without a verdict (closed before any verify: its run failed,
	// was cancelled or gave up), so what went wrong can be looked at; a
	// verified session's sandbox is removed whatever its reward. `ngdriver
	// owner serve` sets it for the local backend (--keep-failed-sandboxes).
	KeepFailed bool
}

// Owner is the lending owner. Its methods are safe for concurrent
// use by many runs.
type Owner struct {
	opt Options
	log *slog.Logger
	// local is the local backend when the owner lends its sandboxes
	// (taken before New wraps the lender, which hides it): its processes
	// are ended by their mount namespace (kill, EndUnowned).
	local *local.Backend

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

	// ckMu serializes the checkpoint side (Export, Install, Retire, ...)
	// and guards exports. Lock order: ckMu, then a session's mu, then mu.
	ckMu    sync.Mutex
	exports map[string]*export // Gym checkpoint id -> what its Export took (checkpoint.go)
}

var _ owner.Owner = (*Owner)(nil)

// session is one rollout's session. mu serializes the calls on it and
// guards the fields up to snapshots; the binding fields after it are
// guarded by Owner.mu.
type session struct {
	mu         sync.Mutex
	id         string
	secret     [sha256.Size]byte // SHA-256 of its cookie's secret; set before it is reachable, never changed
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
	// SessionID is the session's id (the part of its cookie before the
	// '.': SessionIDOf).
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
			panic("owner: Options.Backend and Options.Sandboxes are nil")
		}
		opt.Sandboxes = opt.Backend.Lender()
	}
	if opt.CheckTimeout <= 0 {
		opt.CheckTimeout = DefaultCheckTimeout
	}
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	lb := local.LenderBackend(opt.Sandboxes)
	// A snapshot a fork still uses is kept and removed later.
	opt.Sandboxes = sandbox.KeepSnapshotsInUse(opt.Sandboxes, log.With("owner", "local"))
	opened := make(chan struct{})
	close(opened)
	return &Owner{opt: opt, log: log.With("owner", "local"), local: lb,
		sessions: map[string]*session{}, byKey: map[string]*session{},
		accepting: true, opened: opened, requests: map[gym.EpisodeID]int{}, changed: make(chan struct{}),
		exports: map[string]*export{}}
}

func newSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newSecret makes a session's secret: its cookie's value and the hash the
// owner keeps of it.
func newSecret(id string) (cookie string, sum [sha256.Size]byte) {
	var b [32]byte
	_, _ = rand.Read(b[:])
	secret := hex.EncodeToString(b[:])
	return id + "." + secret, sha256.Sum256([]byte(secret))
}

// parseCookie splits a session cookie into the session id it names and the
// SHA-256 of its secret (for a cookie without a '.', the whole cookie is
// both: see CookieName).
func parseCookie(v string) (id string, sum [sha256.Size]byte) {
	id, secret, found := strings.Cut(v, ".")
	if !found {
		secret = v
	}
	return id, sha256.Sum256([]byte(secret))
}

// SessionIDOf is the session id a cookie set names (not a proof of
// anything): "" when there is no session cookie.
func SessionIDOf(c owner.Cookies) string {
	if c[CookieName] == "" {
		return ""
	}
	id, _ := parseCookie(c[CookieName])
	return id
}

// proves reports, in constant time, whether sum is the hash of the
// session's secret.
func (s *session) proves(sum [sha256.Size]byte) bool {
	return subtle.ConstantTimeCompare(s.secret[:], sum[:]) == 1
}

// refuseCookie is the refusal of a call without the session's cookie: the
// same whatever is wrong with it, naming only the attempt the caller named.
func refuseCookie(call, key string) error {
	where := "this session"
	if key != "" {
		where = fmt.Sprintf("the session of attempt %q", key)
	}
	return fmt.Errorf("owner: %w: %w", ErrSessionCookie,
		gym.Refuse(gym.ErrUnauthorized, "%s on %s needs the %s cookie its seed set", call, where, CookieName))
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
// session is bound to it. A later seed for the same key is answered by the
// rule of CookieName: without the session's cookie it is refused (or, for
// a restored session no call has claimed, makes a fresh session in its
// place). A key of a retired attempt is refused with gym.ErrStaleAttempt;
// while a checkpoint has admission closed the seed waits for it to reopen.
func (o *Owner) SeedSession(ctx context.Context, key string, body json.RawMessage) (owner.SeedReply, error) {
	return o.SeedSessionWith(ctx, key, nil, body)
}

// SeedSessionWith is SeedSession for a caller that sends cookies with the
// seed (as an HTTP client's cookie jar does). When they prove the session
// the seed would continue (the key's, or without a key the one they name),
// that session's seed reply is returned again, or owner.ErrClosed once it
// ended (a late seed must not recreate a closed session). After a restore
// the next attempt's key names the fork of the snapshot, so a seed with
// the restored session's cookie continues it.
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
	cookie, sum := newSecret(s.id)
	s.secret = sum
	given, givenSum := parseCookie(c[CookieName])
	s.mu.Lock() // held until the sandbox exists: a concurrent seed of the key waits for it
	defer s.mu.Unlock()
	o.mu.Lock()
	var existing, replaced *session
	if bound {
		existing = o.byKey[key]
	} else if c[CookieName] != "" {
		existing = o.sessions[given]
	}
	proven := existing != nil && c[CookieName] != "" && existing.id == given && existing.proves(givenSum)
	switch {
	case existing != nil && !proven && bound && existing.restored:
		// Restored, unclaimed, and sought without its cookie: the attempt
		// starts afresh (CookieName); the restored session goes.
		replaced, existing = existing, nil
		replaced.restored = false
		delete(o.sessions, replaced.id)
	case existing != nil && !proven && !bound:
		existing = nil // an unknown or unproven cookie: a new session
	}
	if existing == nil && bound {
		s.bound, s.episode = true, id
		o.byKey[key] = s
	}
	o.mu.Unlock()
	if existing != nil {
		if !proven {
			return owner.SeedReply{}, refuseCookie(callSeed, key)
		}
		return o.seedAgain(existing, c[CookieName])
	}
	if replaced != nil {
		if err := o.free(ctx, replaced); err != nil {
			o.log.Warn("free a restored session a seed without its cookie replaced", "session", replaced.id, "key", key, "err", err)
		}
		o.log.Info("restored session replaced by a seed without its cookie", "session", replaced.id, "key", key, "by", s.id)
	}
	if err := ctx.Err(); err != nil {
		o.unregister(s)
		return owner.SeedReply{}, err
	}
	if !rb.NoSandbox {
		sb, err := o.newSandbox(ctx, sandboxID(s.id, 0), rb.Files)
		if err != nil {
			o.unregister(s)
			return owner.SeedReply{}, fmt.Errorf("owner: seed session %s: %w", s.id, err)
		}
		s.sandboxID, s.workdir = sb.ID(), sb.Workdir()
	}
	o.mu.Lock()
	o.sessions[s.id] = s
	o.mu.Unlock()
	o.log.Info("session seeded", "session", s.id, "key", key, "rollout", rb.RolloutID, "sandbox", s.sandboxID,
		"restart", rb.Restart, "no_sandbox", rb.NoSandbox)
	return s.seedReply(cookie)
}

// seedAgain answers a seed that proved the session with its cookie: its
// reply again (with that cookie), or owner.ErrClosed once it ended.
func (o *Owner) seedAgain(s *session, cookie string) (owner.SeedReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed {
		return owner.SeedReply{}, fmt.Errorf("owner: seed for session %s: a concurrent seed of the same attempt failed", s.id)
	}
	if s.closed {
		return owner.SeedReply{}, fmt.Errorf("owner: seed for session %s: %w", s.id, owner.ErrClosed)
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
	return s.seedReply(cookie)
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

// seedReply is the session's seed reply, setting cookie (s.mu held).
func (s *session) seedReply(cookie string) (owner.SeedReply, error) {
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
		Cookies:    owner.Cookies{CookieName: cookie},
		Restart:    s.body.Restart,
		VerifyMode: s.body.VerifyMode,
		Body:       b,
	}, nil
}

// lookup returns the session call acts on: the one its cookie names and
// proves (CookieName). With a key, that session must be the one bound to
// it (a session seeded without a key is bound to none and takes any).
// Anything else is refused with ErrSessionCookie, the same refusal whatever
// was wrong, before anything is read or changed.
func (o *Owner) lookup(call, key string, c owner.Cookies) (*session, error) {
	v := c[CookieName]
	if v == "" {
		return nil, refuseCookie(call, key)
	}
	id, sum := parseCookie(v)
	o.mu.Lock()
	s := o.sessions[id]
	ok := s != nil && s.proves(sum) && (key == "" || !s.bound || s.episode.CaptureKey() == key)
	o.mu.Unlock()
	if !ok {
		return nil, refuseCookie(call, key)
	}
	return s, nil
}

// Authenticate checks that a call of key carrying c would be let act on a
// session (lookup), without acting: the HTTP server asks it before reading
// a call's body, so a caller without the session's cookie costs nothing.
func (o *Owner) Authenticate(call, key string, c owner.Cookies) error {
	_, err := o.lookup(call, key, c)
	return err
}

// enter finds the session of a call and admits the call (see admit).
func (o *Owner) enter(ctx context.Context, call, key string, c owner.Cookies) (*session, func(), error) {
	id, bound, err := attemptOf(key)
	if err != nil {
		return nil, nil, err
	}
	s, err := o.lookup(call, key, c)
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
		return owner.Access{}, fmt.Errorf("owner: session %s: %w", s.id, owner.ErrClosed)
	}
	if s.sandboxID == "" {
		return owner.Access{}, fmt.Errorf("owner: session %s: %w", s.id, owner.ErrNoSandbox)
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
	if err := o.Authenticate(callVerify, key, c); err != nil {
		return owner.VerifyReply{}, err
	}
	req, err := jsonObject(body)
	if err != nil {
		return owner.VerifyReply{}, fmt.Errorf("owner: %w: %v", ErrBadVerifyBody, err)
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
		return owner.VerifyReply{}, fmt.Errorf("owner: verify session %s: %w", s.id, owner.ErrClosed)
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
			return owner.VerifyReply{}, fmt.Errorf("owner: verify session %s: run the check: %w", s.id, err)
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
		return owner.VerifyReply{}, fmt.Errorf("owner: verify session %s: %w", s.id, err)
	}

	o.log.Info("session verified", "session", s.id, "reward", reply.Reward, "failure_kind", reply.FailureKind)
	if o.endAtReopen(s) {
		return reply, nil
	}
	o.endVerified(ctx, s)
	return reply, nil
}

// endVerified ends a verified session: its sandbox is stopped (a failure
// is logged, the verdict stands, and the sandbox is kept) and it is marked
// closed and verified, its sandbox removed (removeUnused) (s.mu held). The
// stop is shielded from the caller's cancellation (the stop bounds its own
// time): the session is closed whatever the caller does, and nobody would
// retry the stop of a closed session, so a caller gone mid-verify must not
// leave the sandbox's processes running.
func (o *Owner) endVerified(ctx context.Context, s *session) {
	s.closed, s.verified = true, true
	if err := o.stop(context.WithoutCancel(ctx), s.sandboxID); err != nil {
		o.log.Warn("stop the sandbox of a verified session; it is kept", "session", s.id, "sandbox", s.sandboxID, "err", err)
		return
	}
	o.removeUnused(ctx, s, s.sandboxID)
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

// kill ends every process of the sandboxes ids at once: their processes
// belong to a run that crashed. Local sandboxes with namespace isolation
// are ended by the mount namespace their processes run in, all of them in
// one scan of the host (local.Backend.EndSandboxes: no launch folder is
// read, so a launch a restarted owner already ended, whose receipt still
// says it runs, is no search and no warning); other sandboxes through
// Options.KillSandbox (StopSandbox when nil), one by one. It returns the
// error of each sandbox whose processes it could not confirm ended.
func (o *Owner) kill(ctx context.Context, ids ...string) map[string]error {
	failed := map[string]error{}
	var todo []string
	for _, id := range ids {
		if id != "" {
			todo = append(todo, id)
		}
	}
	if o.local != nil && o.local.Isolation() == local.IsolationNamespace {
		if len(todo) == 0 {
			return failed
		}
		if _, err := o.local.EndSandboxes(ctx, todo); err != nil {
			for _, id := range todo {
				failed[id] = err
			}
		}
		return failed
	}
	how := o.opt.KillSandbox
	if how == nil {
		how = o.opt.StopSandbox
	}
	for _, id := range todo {
		if err := o.end(ctx, id, how); err != nil {
			failed[id] = err
		}
	}
	return failed
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

// removeUnused removes the sandbox id with Options.RemoveUnused: a sandbox
// of session s, which has ended (s.mu held), or, with s nil, one no session
// holds any more (the sandbox a restore replaced). Call it only once the
// sandbox's processes were ended: a sandbox whose stop failed is kept, so
// that its launch folders still name what runs (a restarted owner ends it,
// EndUnowned).
func (o *Owner) removeUnused(ctx context.Context, s *session, id string) {
	if id == "" || !o.opt.RemoveUnused {
		return
	}
	sid := ""
	if s != nil {
		sid = s.id
	}
	if err := o.opt.Sandboxes.Remove(context.WithoutCancel(ctx), id); err != nil {
		o.log.Warn("remove an unused sandbox", "session", sid, "sandbox", id, "err", err)
		return
	}
	if s != nil && s.sandboxID == id {
		s.sandboxID = ""
	}
	o.log.Info("sandbox removed", "session", sid, "sandbox", id)
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
		return fmt.Errorf("owner: close session %s: stop sandbox %s: %w", s.id, s.sandboxID, err)
	}
	s.closed = true
	o.log.Info("session closed", "session", s.id)
	if o.opt.KeepFailed && s.sandboxID != "" {
		o.log.Info("sandbox kept: its session ended without a verdict", "session", s.id, "sandbox", s.sandboxID)
		return nil
	}
	o.removeUnused(ctx, s, s.sandboxID)
	return nil
}

// Session describes the session the cookies name and prove.
func (o *Owner) Session(c owner.Cookies) (SessionInfo, error) {
	s, err := o.lookup("session", "", c)
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
