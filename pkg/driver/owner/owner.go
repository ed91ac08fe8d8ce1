// Package owner is the driver's side of the sandbox owner (the resources
// server that lends sandboxes): the calls of one rollout's session, with the
// shapes of the rollout framework's HTTP calls (shared/notes/gym-protocols.md).
// An HTTP client and the embedded local owner both implement Owner.
package owner

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
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
		Kind       string             `json:"kind"`
		Descriptor sandbox.Descriptor `json:"descriptor"`
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
// servers, and after a restore it is how the attempt + 1 finds the session
// restored for it.
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
