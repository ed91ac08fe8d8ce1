// Package opensandbox is the sandbox backend for OpenSandbox: commands and
// files through each sandbox's execd (reached through the lifecycle
// server's endpoint lookup, with the headers it names), and, for an owner
// that lends OpenSandbox sandboxes, the lifecycle calls: create from an
// image or a snapshot, snapshot (polled until ready), delete, and renew
// expiration. It uses only the documented HTTP API (no SDK).
//
// Every command is one foreground execd command: `bash -c` of a script
// (Script) around a line built by sandbox.CommandLine (every word quoted,
// so no task text, id or path can inject a command) that enforces the
// timeout inside the sandbox and reports the command's exact output and
// exit status itself, since real execd's events carry neither (see
// shared/notes/sandbox-backends.md); a command the client stops following
// is ended in the sandbox by its nonce (KillScript). The driver never follows a
// launch by execd's command ids: ngsup keeps the launch's state on the
// sandbox's disk, so a restart of execd (which forgets every command id)
// or a finished command reported late changes nothing.
//
// Errors are classified with the sentinels of package sandbox: a request
// that could not be sent (connection refused) is retried for a while, the
// endpoint looked up again in between, whatever the command, since it
// never ran; one that broke after it was sent wraps sandbox.ErrTransport
// and is not retried here (the caller knows whether the command may run
// twice). 401 and 403 are sandbox.ErrUnauthorized; a sandbox the lifecycle
// server no longer knows is sandbox.ErrGone; a deadline is
// sandbox.ErrTimeout.
package opensandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Name is the provider name descriptors use.
const Name = "opensandbox"

// Defaults of Options.
const (
	DefaultRoot    = sandbox.DefaultRoot
	DefaultWorkdir = sandbox.DefaultWorkdir
	// DefaultTimeout bounds a command whose request sets no timeout.
	DefaultTimeout = sandbox.DefaultTimeout
	// DefaultRetryFor is how long a request that could not be sent is
	// tried again.
	DefaultRetryFor = 30 * time.Second
	// DefaultTTL is a new sandbox's lifetime (renewed by the owner).
	DefaultTTL = time.Hour
)

// Options configure a Backend.
type Options struct {
	// Server is the lifecycle server's URL (e.g. http://opensandbox:8080).
	Server string
	// APIKey is sent in OPEN-SANDBOX-API-KEY.
	APIKey string
	// Root is where ngharness keeps its files in every sandbox (default
	// /var/lib/ngharness); it must be on the filesystem a snapshot keeps.
	Root string
	// Workdir is the task's working folder when a descriptor names none
	// (default /workspace).
	Workdir string
	// UID and GID, if set, run every command as that user.
	UID, GID *int
	// RetryFor bounds the retries of a request that could not be sent
	// (default 30 s).
	RetryFor time.Duration
	// UseServerProxy asks the endpoint lookup for a server-proxied URL.
	UseServerProxy bool
	// HTTP is the client of both the lifecycle server and execd (nil: a
	// client of its own).
	HTTP *http.Client
	// Poll is the interval of the lifecycle polls (default 500 ms).
	Poll time.Duration
	// MaxOutput bounds the stdout, and the stderr, an Exec reads back
	// (default DefaultMaxOutput); a command that wrote more is an error
	// naming the size.
	MaxOutput int64

	// What an owner's new sandboxes are made of.

	// Image is the image of a new sandbox (Create).
	Image string
	// Entrypoint is a new sandbox's entry process (default tail -f
	// /dev/null).
	Entrypoint []string
	// TTL is a new sandbox's lifetime, renewed by Renew (default 1 h).
	TTL time.Duration
	// ResourceLimits of a new sandbox (default cpu 1, memory 2Gi).
	ResourceLimits map[string]string
	// Env is a new sandbox's environment.
	Env map[string]string
	// Metadata is added to every sandbox the backend creates.
	Metadata map[string]string
}

// Backend reaches OpenSandbox sandboxes. Its methods are safe for
// concurrent use.
type Backend struct {
	opt Options
	lc  *Lifecycle

	mu        sync.Mutex
	endpoints map[string]*Execd // sandbox id -> its execd, as last looked up
}

// New makes a backend for the lifecycle server opt.Server.
func New(opt Options) (*Backend, error) {
	if opt.Server == "" {
		return nil, errors.New("opensandbox: no server URL")
	}
	if !strings.HasPrefix(opt.Server, "http://") && !strings.HasPrefix(opt.Server, "https://") {
		return nil, fmt.Errorf("opensandbox: the server URL %q is not http:// or https://", opt.Server)
	}
	var err error
	if opt.Root, opt.Workdir, err = sandbox.Folders(opt.Root, opt.Workdir); err != nil {
		return nil, fmt.Errorf("opensandbox: %w", err)
	}
	if opt.RetryFor <= 0 {
		opt.RetryFor = DefaultRetryFor
	}
	if opt.TTL <= 0 {
		opt.TTL = DefaultTTL
	}
	if opt.MaxOutput <= 0 {
		opt.MaxOutput = DefaultMaxOutput
	}
	if len(opt.Entrypoint) == 0 {
		opt.Entrypoint = []string{"tail", "-f", "/dev/null"}
	}
	if opt.ResourceLimits == nil {
		opt.ResourceLimits = map[string]string{"cpu": "1", "memory": "2Gi"}
	}
	if opt.HTTP == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		opt.HTTP = &http.Client{Transport: tr}
	}
	lc := &Lifecycle{URL: opt.Server, APIKey: opt.APIKey, HTTP: opt.HTTP, Poll: opt.Poll}
	return &Backend{opt: opt, lc: lc, endpoints: map[string]*Execd{}}, nil
}

// Name is "opensandbox".
func (b *Backend) Name() string { return Name }

// Lifecycle is the backend's lifecycle client.
func (b *Backend) Lifecycle() *Lifecycle { return b.lc }

// Root is the root folder of every sandbox.
func (b *Backend) Root() string { return b.opt.Root }

// Connect returns the sandbox a descriptor names, once its execd endpoint
// is known (a sandbox the server does not know is sandbox.ErrGone).
func (b *Backend) Connect(ctx context.Context, d sandbox.Descriptor) (sandbox.Sandbox, error) {
	if d.Provider != "" && d.Provider != Name {
		return nil, fmt.Errorf("opensandbox: the descriptor names provider %q, not %q", d.Provider, Name)
	}
	if d.SandboxID == "" {
		return nil, errors.New("opensandbox: the descriptor names no sandbox")
	}
	if d.Workdir != "" && !path.IsAbs(d.Workdir) {
		return nil, fmt.Errorf("opensandbox: the descriptor's workdir %q is not an absolute path", d.Workdir)
	}
	s := b.open(d.SandboxID, d.Workdir)
	if _, err := s.execd(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (b *Backend) open(id, workdir string) *Sandbox {
	if workdir == "" {
		workdir = b.opt.Workdir
	}
	return &Sandbox{b: b, id: id, workdir: path.Clean(workdir)}
}

// endpoint returns the execd client of the sandbox, looking it up when
// it is not known (or fresh is set).
func (b *Backend) endpoint(ctx context.Context, id string, fresh bool) (*Execd, error) {
	b.mu.Lock()
	ex := b.endpoints[id]
	b.mu.Unlock()
	if ex != nil && !fresh {
		return ex, nil
	}
	ep, err := b.lc.Endpoint(ctx, id, ExecdPort, b.opt.UseServerProxy)
	if err != nil {
		return nil, err
	}
	ex = &Execd{URL: ep.URL, Headers: ep.Headers, HTTP: b.opt.HTTP}
	b.mu.Lock()
	b.endpoints[id] = ex
	b.mu.Unlock()
	return ex, nil
}

func (b *Backend) forget(id string) {
	b.mu.Lock()
	delete(b.endpoints, id)
	b.mu.Unlock()
}

// Sandbox is one OpenSandbox sandbox. It implements sandbox.Sandbox.
type Sandbox struct {
	b       *Backend
	id      string
	workdir string
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// ID is the sandbox's id on the lifecycle server.
func (s *Sandbox) ID() string { return s.id }

// Root is the backend's root folder.
func (s *Sandbox) Root() string { return s.b.opt.Root }

// Workdir is the descriptor's workdir, or the backend's.
func (s *Sandbox) Workdir() string { return s.workdir }

func (s *Sandbox) execd(ctx context.Context) (*Execd, error) {
	return s.b.endpoint(ctx, s.id, false)
}

// Execd returns the client of the sandbox's execd (for the background
// command API: Start, Status, Logs, Interrupt).
func (s *Sandbox) Execd(ctx context.Context) (*Execd, error) { return s.execd(ctx) }

// withExecd runs call with the sandbox's execd. A call that could not be
// sent is tried again (the endpoint looked up again first) until RetryFor
// has passed; then, and after a call that broke once sent, the lifecycle
// server is asked whether the sandbox still exists, so a deleted sandbox
// is reported as sandbox.ErrGone, naming it.
func (s *Sandbox) withExecd(ctx context.Context, what string, call func(*Execd) error) error {
	deadline := time.Now().Add(s.b.opt.RetryFor)
	fresh := false
	for n := 0; ; n++ {
		ex, err := s.b.endpoint(ctx, s.id, fresh)
		if err == nil {
			err = call(ex)
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || !errors.Is(err, sandbox.ErrTransport) {
			if errors.Is(err, sandbox.ErrGone) {
				s.b.forget(s.id)
			}
			return fmt.Errorf("%s in %s: %w", what, s.id, err)
		}
		if NotSent(err) && time.Now().Before(deadline) {
			fresh = true
			if serr := sleep(ctx, backoff(n)); serr != nil {
				return fmt.Errorf("%s in %s: %w (after %v)", what, s.id, serr, err)
			}
			continue
		}
		// The connection failed: is the sandbox still there?
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		_, gerr := s.b.lc.Get(gctx, s.id)
		cancel()
		if errors.Is(gerr, sandbox.ErrGone) {
			s.b.forget(s.id)
			return fmt.Errorf("%s in %s: sandbox %s: %w (%v)", what, s.id, s.id, sandbox.ErrGone, err)
		}
		s.b.forget(s.id)
		return fmt.Errorf("%s in %s: %w", what, s.id, err)
	}
}

// Exec runs req as one foreground execd command, the bash -c text of
// Script: the command line (every word quoted) in a process group of its
// own, its timeout (req.Timeout, default 10 min) enforced inside the
// sandbox, its exact stdout and stderr and its real exit status (128+N
// for signal N) reported by the script itself, since execd's own events
// carry neither. Exec returns at the final event, without waiting for
// execd to close the stream. A command killed by its timeout is
// sandbox.ErrTimeout. Stdin, when set, is uploaded to a file under Root
// first. A request that could not be sent is tried again, whatever the
// command (it never ran); a connection that broke after the command was
// sent is an error wrapping sandbox.ErrTransport (the command may have
// run) and is not retried. When ctx ends first, or the stream broke, the
// command is ended in the sandbox (KillScript), since execd does not end a
// command whose client went away. Output past Options.MaxOutput is an
// error naming its size.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	start := time.Now()
	fail := sandbox.ExecResult{ExitCode: -1}
	req, timeout, line, err := sandbox.PrepareExec(ctx, s.id, s.workdir, req)
	if err != nil {
		return fail, err
	}
	nonce := randomHex(8)
	tmp := path.Join(s.b.opt.Root, "tmp")
	var stdinFile string
	if req.Stdin != nil {
		data, err := io.ReadAll(req.Stdin)
		if err != nil {
			return fail, fmt.Errorf("exec in %s: read its stdin: %w", s.id, err)
		}
		stdinFile = path.Join(tmp, "ngx-"+nonce+".in")
		if err := s.upload(ctx, stdinFile, data, 0o600); err != nil {
			return fail, fmt.Errorf("exec in %s: upload its stdin: %w", s.id, err)
		}
	}
	cmd := Command{
		Command:   Script(line, timeout, tmp, nonce, stdinFile, s.b.opt.MaxOutput),
		TimeoutMS: (timeout + 5*time.Second).Milliseconds(),
		UID:       s.b.opt.UID,
		GID:       s.b.opt.GID,
	}
	cctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	var res Result
	err = s.withExecd(cctx, "exec", func(ex *Execd) error {
		var rerr error
		res, rerr = ex.Run(cctx, cmd, nil)
		return rerr
	})
	out := sandbox.ExecResult{ExitCode: -1, Duration: time.Since(start)}
	if err != nil {
		if !NotSent(err) && !errors.Is(err, sandbox.ErrGone) && !errors.Is(err, sandbox.ErrUnauthorized) {
			s.abandon(ctx, tmp, nonce)
		}
		if ctx.Err() == nil && cctx.Err() != nil && !errors.Is(err, sandbox.ErrTimeout) {
			err = fmt.Errorf("%w: %w", sandbox.ErrTimeout, err)
		}
		return out, err
	}
	rep, perr := parseReport(res.Stdout, nonce)
	out.Stdout, out.Stderr = rep.stdout, rep.stderr
	switch {
	case perr != nil:
		return out, fmt.Errorf("exec in %s: %w", s.id, perr)
	case rep.fail != "":
		return out, fmt.Errorf("exec in %s: the command could not be started: %s", s.id, rep.fail)
	case rep.cancelled:
		return out, fmt.Errorf("exec in %s: the command was cancelled before it started", s.id)
	case !rep.ended:
		why := "no event"
		if res.Error != nil {
			why = fmt.Sprintf("%s %s %s", res.Error.EName, res.Error.EValue, strings.Join(res.Error.Traceback, "; "))
		}
		if res.ExitCode < 0 && time.Since(start) >= timeout {
			return out, fmt.Errorf("exec in %s: %w after %s (execd ended it: %s)", s.id, sandbox.ErrTimeout, timeout, why)
		}
		return out, fmt.Errorf("exec in %s: the command ended without reporting its status (execd said %s)", s.id, why)
	}
	out.ExitCode = rep.exitCode
	if rep.timedOut {
		return out, fmt.Errorf("exec in %s: %w after %s", s.id, sandbox.ErrTimeout, timeout)
	}
	if rep.big != "" {
		return out, fmt.Errorf("exec in %s: the command exited %d but its %s, more than the %d bytes the backend reads back (Options.MaxOutput)",
			s.id, rep.exitCode, rep.big, s.b.opt.MaxOutput)
	}
	return out, nil
}

// abandon ends, from the client's side, the exec with nonce whose stream
// the client stopped following (KillScript), best effort and bounded.
func (s *Sandbox) abandon(ctx context.Context, tmp, nonce string) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	_ = s.withExecd(kctx, "end an abandoned exec", func(ex *Execd) error {
		_, err := ex.Run(kctx, Command{Command: KillScript(tmp, nonce), TimeoutMS: 10000}, nil)
		return err
	})
}

// Upload writes data to path with mode, atomically: the file is uploaded
// under a temporary name in the same folder (execd makes the folders),
// then renamed over path.
func (s *Sandbox) Upload(ctx context.Context, p string, data []byte, mode uint32) error {
	if !path.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("opensandbox: upload to %s: path %q is not absolute", s.id, p)
	}
	p = path.Clean(p)
	tmp := path.Join(path.Dir(p), ".upload-"+randomHex(6)+"-"+path.Base(p))
	if len(path.Base(tmp)) > 255 {
		tmp = path.Join(path.Dir(p), ".upload-"+randomHex(6))
	}
	if err := s.upload(ctx, tmp, data, mode); err != nil {
		return fmt.Errorf("opensandbox: upload %s: %w", p, err)
	}
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"mv", "-f", "--", tmp, p}, Dir: "/", Timeout: 60 * time.Second})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("mv exited %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	if err != nil {
		_, _ = s.Exec(context.WithoutCancel(ctx), sandbox.ExecRequest{Argv: []string{"rm", "-f", "--", tmp}, Dir: "/", Timeout: 30 * time.Second})
		return fmt.Errorf("opensandbox: upload %s: put it in place: %w", p, err)
	}
	return nil
}

// upload is one POST /files/upload of data to p (not atomic). It is
// idempotent, so a connection that broke is tried again too.
func (s *Sandbox) upload(ctx context.Context, p string, data []byte, mode uint32) error {
	meta := FileMetadata{Path: p, Mode: OctalDigits(mode)}
	var err error
	for n := 0; n < 3; n++ {
		if n > 0 {
			if serr := sleep(ctx, backoff(n)); serr != nil {
				return err
			}
		}
		err = s.withExecd(ctx, "upload "+p, func(ex *Execd) error { return ex.Upload(ctx, meta, data) })
		if err == nil || !errors.Is(err, sandbox.ErrTransport) || errors.Is(err, sandbox.ErrGone) {
			return err
		}
	}
	return err
}

// Download reads a file of the sandbox (a missing one is
// sandbox.ErrNotFound).
func (s *Sandbox) Download(ctx context.Context, p string) ([]byte, error) {
	var data []byte
	err := s.withExecd(ctx, "download "+p, func(ex *Execd) error {
		var derr error
		data, derr = ex.Download(ctx, p)
		return derr
	})
	return data, err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
