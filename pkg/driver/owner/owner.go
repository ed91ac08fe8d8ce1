// Package owner is the driver's side of the sandbox owner (the resources
// server that lends sandboxes): the calls of one rollout's session, with the
// shapes of the rollout framework's HTTP calls (docs/gym.md, "What the
// driver sends to a resources server").
// An HTTP client and the lending owner both implement Owner.
package owner

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/gym"
)

// Cookies are the session cookies a seed reply set; every later call of the
// run sends them back. They are kept in the harness bookmark.
type Cookies map[string]string

// SeedReply is the owner's answer to /seed_session.
type SeedReply struct {
	// Cookies identify the session for the later calls.
	Cookies Cookies `json:"cookies"`
	// Restart is set by the header x-ng-checkpoint-restart: the owner cannot
	// capture this session, so the run is never parked and starts over
	// after a crash.
	Restart bool `json:"restart"`
	// VerifyMode is the header x-ng-checkpoint-verify ("" or "replay").
	VerifyMode string `json:"verify_mode,omitempty"`
	// Body is the reply's JSON (e.g. {sandbox_handle, workdir}).
	Body json.RawMessage `json:"body,omitempty"`
}

// Access is the owner's answer to /sandbox_access: which sandbox is current.
// After a restore it names a fork of the snapshot under a new id.
type Access struct {
	Connection struct {
		Kind string `json:"kind"`
		// ProviderConfigRef names the sandbox provider's config, as Gym's
		// DirectSandboxConnection does.
		ProviderConfigRef string             `json:"provider_config_ref,omitempty"`
		Descriptor        sandbox.Descriptor `json:"descriptor"`
	} `json:"connection"`
	Workdir string `json:"workdir"`
}

// VerifyReply is the owner's verdict: the run body, the response, and the
// fields the owner adds.
type VerifyReply struct {
	Reward        float64 `json:"reward"`
	MaskSample    bool    `json:"mask_sample"`
	FailureKind   string  `json:"failure_kind,omitempty"`
	FailureReason string  `json:"failure_reason,omitempty"`
	// Body is the whole reply as the owner sent it.
	Body json.RawMessage `json:"-"`
}

// ErrNoSandbox means the session has no sandbox (/sandbox_access answered
// 404): the run is a restart.
var ErrNoSandbox = errors.New("the session has no sandbox")

// ErrClosed means the session was closed already.
var ErrClosed = errors.New("session closed")

// Owner is one sandbox owner, as seen by the driver. Every call names the
// attempt it belongs to by its capture key (gym.EpisodeID.CaptureKey: the
// rollout id, with "-a<N>" after attempt 0): over HTTP it is the
// /ng-rollout/<key>/ prefix that binds the session on Gym's resources
// servers. Every call after the seed carries the cookies the seed set:
// they are what proves the session is the caller's (the embedded owner
// refuses a call without them), and after a restore the attempt + 1 finds
// the session restored for it by its key and those cookies, which the
// bookmark kept.
type Owner interface {
	// SeedSession starts the attempt's session with its run body.
	SeedSession(ctx context.Context, key string, body json.RawMessage) (SeedReply, error)
	// SandboxAccess says which sandbox the session uses now.
	SandboxAccess(ctx context.Context, key string, c Cookies) (Access, error)
	// Verify grades the run (body plus "response"); the owner ends the
	// session.
	Verify(ctx context.Context, key string, c Cookies, body json.RawMessage) (VerifyReply, error)
	// CloseSession ends the session without a verdict. Idempotent.
	CloseSession(ctx context.Context, key string, c Cookies) error
}

// HandleAccess builds the Access a seed reply's body names, for an owner
// without /sandbox_access (it answers 404): Gym's main-branch SWE-bench
// server answers the seed with {"sandbox_handle": "<sandbox id>"} (the
// sandbox's id at its provider; the workdir is the image's WORKDIR, so the
// reply has none), and the lending owner with {"sandbox_handle": id,
// "workdir": dir}. An optional "provider_config_ref" string names the
// provider. The second result is false when the body names no sandbox (no
// object, no handle, or a handle that is not a non-empty string).
func (r SeedReply) HandleAccess() (Access, bool) {
	var body struct {
		Handle   json.RawMessage `json:"sandbox_handle"`
		Workdir  json.RawMessage `json:"workdir"`
		Provider json.RawMessage `json:"provider_config_ref"`
	}
	if json.Unmarshal(r.Body, &body) != nil {
		return Access{}, false
	}
	handle, ok := jsonString(body.Handle)
	if !ok || strings.TrimSpace(handle) == "" {
		return Access{}, false
	}
	workdir, _ := jsonString(body.Workdir)
	provider, _ := jsonString(body.Provider)
	var a Access
	a.Connection.Kind = "direct"
	a.Connection.ProviderConfigRef = provider
	a.Connection.Descriptor = sandbox.Descriptor{Provider: provider, SandboxID: handle, Workdir: workdir}
	a.Workdir = workdir
	return a, true
}

// jsonString decodes raw when it is a JSON string.
func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// CheckpointOwner is the owner's side of a checkpoint: it is a
// gym.Participant of kind resources (gym.KindResources), driven by a
// gym.Control like every other participant. At a commit it snapshots the
// sandbox of every open session in scope and exports one record per
// session; at a restore, in a process that may never have seen those
// sessions, it forks each snapshot into a new sandbox bound to the
// attempt after the exported one, so that attempt's seed finds it; retire
// frees what an attempt holds. The lending owner
// (lending.Owner) implements it; the driver never imports that package.
type CheckpointOwner interface {
	gym.Participant
	gym.RestoredKeeper
	gym.StatusExtender
	// Attach gives the participant the control plane that drives it: it
	// calls Notify when its readiness may have changed and refuses retired
	// attempts with CheckAttempt on its data plane.
	Attach(c *gym.Control)
}

// NewControl builds the control plane of p (gym.NewControl) and attaches
// p to it.
func NewControl(p CheckpointOwner, cfg gym.Config) (*gym.Control, error) {
	c, err := gym.NewControl(p, cfg)
	if err != nil {
		return nil, err
	}
	p.Attach(c)
	return c, nil
}
