package drivertest

import (
	"context"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Exec is one exec the driver ran through the recording backend.
type Exec struct {
	Sandbox string
	Argv    []string
	Env     map[string]string
	Timeout time.Duration
	// ExitCode and Err are what the exec returned (after any hook).
	ExitCode int
	Err      error
	// Start and End are when it began and returned.
	Start, End time.Time
}

// Verb is the ngsup verb of the exec ("" when it does not run ngsup).
func (e Exec) Verb() string {
	if len(e.Argv) < 2 || !IsNgsup(e.Argv[0]) {
		return ""
	}
	return e.Argv[1]
}

// Has reports whether argv holds the word w.
func (e Exec) Has(w string) bool { return slices.Contains(e.Argv, w) }

// Arg returns the word after flag in argv ("" when absent).
func (e Exec) Arg(flag string) string {
	for i, a := range e.Argv {
		if a == flag && i+1 < len(e.Argv) {
			return e.Argv[i+1]
		}
	}
	return ""
}

// IsNgsup reports whether p is the path of the uploaded ngsup.
func IsNgsup(p string) bool { return strings.HasPrefix(path.Base(p), "ngsup-") }

// Next runs the exec (the real backend, or the next hook).
type Next func(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error)

// ExecHook sees every exec of the driver before it runs. It may pass it on
// (next), hold it, or answer it without running it.
type ExecHook func(ctx context.Context, sb sandbox.Sandbox, req sandbox.ExecRequest, next Next) (sandbox.ExecResult, error)

// Backend wraps the real backend the Runner connects through: every exec of
// the driver (and of the adapter) is recorded, and may be intercepted;
// every upload is recorded.
type Backend struct {
	inner sandbox.Backend

	mu      sync.Mutex
	execs   []Exec
	hook    ExecHook
	uploads map[string][]string // sandbox id -> the paths uploaded, in order
	opaque  bool                // see HideCapabilities
}

// NewBackend wraps inner.
func NewBackend(inner sandbox.Backend) *Backend { return &Backend{inner: inner} }

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return b.inner.Name() }

// Connect implements sandbox.Backend: the real sandbox, wrapped.
func (b *Backend) Connect(ctx context.Context, d sandbox.Descriptor) (sandbox.Sandbox, error) {
	sb, err := b.inner.Connect(ctx, d)
	if err != nil {
		return nil, err
	}
	return b.Wrap(sb), nil
}

// Wrap returns sb with its execs recorded (and hooked) by b.
func (b *Backend) Wrap(sb sandbox.Sandbox) sandbox.Sandbox {
	w := &Sandbox{Sandbox: sb, b: b}
	b.mu.Lock()
	opaque := b.opaque
	b.mu.Unlock()
	if opaque {
		return opaqueSandbox{w}
	}
	return w
}

// HideCapabilities makes the sandboxes b connects from now on hide the
// real sandbox's optional capabilities from the driver (they are wrapped
// without sandbox.Unwrapper): a local sandbox's shared tools and host
// batching are not used, ngsup is uploaded into each sandbox as into a
// remote one, and the driver pauses and continues each launch alone. The
// remote backends have neither capability: for them nothing changes.
func (b *Backend) HideCapabilities() {
	b.mu.Lock()
	b.opaque = true
	b.mu.Unlock()
}

// opaqueSandbox is a recorded sandbox without its Unwrap (see
// HideCapabilities).
type opaqueSandbox struct{ sandbox.Sandbox }

// SetHook installs h (nil removes the hook).
func (b *Backend) SetHook(h ExecHook) {
	b.mu.Lock()
	b.hook = h
	b.mu.Unlock()
}

// Execs returns every exec recorded so far (those that returned).
func (b *Backend) Execs() []Exec {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.execs)
}

// Verbs returns the recorded ngsup execs of verb (all ngsup execs for "").
func (b *Backend) Verbs(verb string) []Exec {
	var out []Exec
	for _, e := range b.Execs() {
		if v := e.Verb(); v != "" && (verb == "" || v == verb) {
			out = append(out, e)
		}
	}
	return out
}

// ForLaunch keeps the execs whose argv names the launch folder or id.
func ForLaunch(execs []Exec, launchID string) []Exec {
	var out []Exec
	for _, e := range execs {
		for _, a := range e.Argv {
			if a == launchID || strings.HasSuffix(a, "/"+launchID) {
				out = append(out, e)
				break
			}
		}
	}
	return out
}

// Uploads returns the paths uploaded into the sandbox so far, in order.
func (b *Backend) Uploads(sandboxID string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.uploads[sandboxID])
}

// NgsupUploads counts the uploads of ngsup into the sandbox.
func (b *Backend) NgsupUploads(sandboxID string) int {
	n := 0
	for _, p := range b.Uploads(sandboxID) {
		if IsNgsup(p) {
			n++
		}
	}
	return n
}

// Sandbox is a real sandbox whose execs and uploads the Backend records.
type Sandbox struct {
	sandbox.Sandbox
	b *Backend
}

// Unwrap returns the real sandbox.
func (s *Sandbox) Unwrap() sandbox.Sandbox { return s.Sandbox }

// Exec implements sandbox.Sandbox.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	s.b.mu.Lock()
	hook := s.b.hook
	s.b.mu.Unlock()
	rec := Exec{Sandbox: s.ID(), Argv: slices.Clone(req.Argv), Timeout: req.Timeout, Start: time.Now()}
	if len(req.Env) > 0 {
		rec.Env = make(map[string]string, len(req.Env))
		for k, v := range req.Env {
			rec.Env[k] = v
		}
	}
	var res sandbox.ExecResult
	var err error
	if hook != nil {
		res, err = hook(ctx, s.Sandbox, req, s.Sandbox.Exec)
	} else {
		res, err = s.Sandbox.Exec(ctx, req)
	}
	rec.ExitCode, rec.Err, rec.End = res.ExitCode, err, time.Now()
	s.b.mu.Lock()
	s.b.execs = append(s.b.execs, rec)
	s.b.mu.Unlock()
	return res, err
}

// Upload implements sandbox.Sandbox; an upload that succeeded is recorded.
func (s *Sandbox) Upload(ctx context.Context, p string, data []byte, mode uint32) error {
	err := s.Sandbox.Upload(ctx, p, data, mode)
	if err == nil {
		s.b.mu.Lock()
		if s.b.uploads == nil {
			s.b.uploads = map[string][]string{}
		}
		s.b.uploads[s.ID()] = append(s.b.uploads[s.ID()], p)
		s.b.mu.Unlock()
	}
	return err
}
