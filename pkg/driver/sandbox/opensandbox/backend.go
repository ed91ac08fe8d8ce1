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
// exit status itself, since real execd's events carry neither
// (docs/driver.md, "OpenSandbox", lists what they carry instead); a
// command the client stops following is ended in the sandbox by its nonce
// (KillScript). The driver never
// follows a launch by execd's command ids: ngsup keeps the launch's state on the
// sandbox's disk, so a restart of execd (which forgets every command id)
// or a finished command reported late changes nothing.
//
// Errors are classified with the sentinels of package sandbox: a request
// that could not be sent (connection refused) is retried for a while, the
// endpoint looked up again in between, whatever the command, since it
// never ran; one that broke after it was sent wraps sandbox.ErrTransport
// and is retried only when it may be repeated (a ping, a status, a
// download, an upload to a path of its own), never an exec (the caller
// knows whether the command may run twice). 401 and 403 are
// sandbox.ErrUnauthorized; a sandbox the lifecycle server no longer knows,
// or reports gone for good (GoneState: Failed, as a deleted one answers
// before its 404), is sandbox.ErrGone; a snapshot a fork still uses is
// sandbox.ErrSnapshotInUse; a deadline is sandbox.ErrTimeout. A sandbox is
// ready when its execd answers (the server reports Running before execd
// listens), and a command's stream that ends without its final event is
// settled from the report its script keeps (docs/driver.md, "OpenSandbox").
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
	// DefaultMaxUploads is how many large uploads (LargeUpload bytes or
	// more) run at once: ngsup is 3.5 MB, and 256 at once held 535 MB in
	// the driver (docs/BENCHMARKS.md).
	DefaultMaxUploads = 8
	// LargeUpload is the size from which an upload waits for one of
	// MaxUploads slots; smaller ones (a command's stdin, a task's files)
	// never wait behind a binary.
	LargeUpload = 256 << 10
)

// Options configure a Backend. The json tags are the keys of its section
// of ngdriver's config (backends.opensandbox, read by
// config.DecodeSection), beside api_key_env, the variable holding the key
// when api_key is not given; what only a program sets (HTTP, Poll,
// MaxOutput) is no key.
type Options struct {
	// Server is the lifecycle server's URL (e.g. http://opensandbox:8080).
	Server string `json:"server"`
	// APIKey is sent in OPEN-SANDBOX-API-KEY.
	APIKey string `json:"api_key"`
	// Root is where ngharness keeps its files in every sandbox (default
	// /var/lib/ngharness); it must be on the filesystem a snapshot keeps.
	Root string `json:"root"`
	// Workdir is the task's working folder when a descriptor names none
	// (default /workspace).
	Workdir string `json:"workdir"`
	// UID and GID, if set, run every command as that user.
	UID *int `json:"uid"`
	GID *int `json:"gid"`
	// RetryFor bounds the retries of a request that could not be sent
	// (default 30 s).
	RetryFor time.Duration `json:"retry_for"`
	// UseServerProxy asks the endpoint lookup for a server-proxied URL.
	UseServerProxy bool `json:"use_server_proxy"`
	// HTTP is the client of both the lifecycle server and execd (nil: a
	// client of its own).
	HTTP *http.Client `json:"-"`
	// Poll is the interval of the lifecycle polls (default 500 ms).
	Poll time.Duration `json:"-"`
	// MaxOutput bounds the stdout, and the stderr, an Exec reads back
	// (default DefaultMaxOutput); a command that wrote more is an error
	// naming the size.
	MaxOutput int64 `json:"-"`
	// MaxUploads bounds the uploads of LargeUpload bytes or more that run
	// at once across every sandbox of the backend (default
	// DefaultMaxUploads): each holds its data and a connection until the
	// sandbox has it all.
	MaxUploads int `json:"max_uploads"`

	// What an owner's new sandboxes are made of.

	// Image is the image of a new sandbox (Create).
	Image string `json:"image"`
	// Entrypoint is a new sandbox's entry process (default tail -f
	// /dev/null).
	Entrypoint []string `json:"entrypoint"`
	// TTL is a new sandbox's lifetime, renewed by Renew (default 1 h).
	TTL time.Duration `json:"ttl"`
	// ResourceLimits of a new sandbox (default cpu 1, memory 2Gi).
	ResourceLimits map[string]string `json:"resource_limits"`
	// Env is a new sandbox's environment.
	Env map[string]string `json:"env"`
	// Metadata is added to every sandbox the backend creates.
	Metadata map[string]string `json:"metadata"`
}

// Backend reaches OpenSandbox sandboxes. Its methods are safe for
// concurrent use.
type Backend struct {
	opt Options
	lc  *Lifecycle

	// uploads holds a token per large upload in flight (MaxUploads).
	uploads chan struct{}

	mu        sync.Mutex
	endpoints map[string]*Execd // sandbox id -> its execd, as last looked up
	// spent are, per sandbox, the nonces of execs whose report came: the
	// next exec there removes their report files (Script's drop).
	spent map[string][]string
}

// DropPerExec bounds how many earlier execs' reports one exec removes.
const DropPerExec = 32

// takeSpent hands out up to DropPerExec nonces whose reports the next
// exec in sandbox id removes.
func (b *Backend) takeSpent(id string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	all := b.spent[id]
	n := min(len(all), DropPerExec)
	out := all[len(all)-n:]
	if n == len(all) {
		delete(b.spent, id)
	} else {
		b.spent[id] = all[:len(all)-n]
	}
	return out
}

// addSpent records nonces whose reports are to be removed by a later exec
// in sandbox id.
func (b *Backend) addSpent(id string, nonces ...string) {
	if len(nonces) == 0 {
		return
	}
	b.mu.Lock()
	b.spent[id] = append(b.spent[id], nonces...)
	b.mu.Unlock()
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
	if opt.MaxUploads <= 0 {
		opt.MaxUploads = DefaultMaxUploads
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
	return &Backend{
		opt: opt, lc: lc, uploads: make(chan struct{}, opt.MaxUploads),
		endpoints: map[string]*Execd{}, spent: map[string][]string{},
	}, nil
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

// forgetAll drops what the backend knows of a sandbox that is removed.
func (b *Backend) forgetAll(id string) {
	b.mu.Lock()
	delete(b.endpoints, id)
	delete(b.spent, id)
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
// has passed; an idempotent one (a ping, a status, a download, an upload
// to a fresh path) is tried again as well when it broke once sent, as
// through the moments after a create when connections to execd are
// accepted and dropped. After a call that broke once sent, and once the
// retries are over, the lifecycle server is asked whether the sandbox
// still exists: a 404 or a state gone for good (GoneState: Failed, as a
// deleted sandbox answers before it is removed) is sandbox.ErrGone,
// naming it.
func (s *Sandbox) withExecd(ctx context.Context, what string, idempotent bool, call func(*Execd) error) error {
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
		late := !time.Now().Before(deadline)
		if !NotSent(err) || late {
			// The connection failed: is the sandbox still there?
			gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			_, gerr := s.b.lc.Alive(gctx, s.id)
			cancel()
			if errors.Is(gerr, sandbox.ErrGone) {
				s.b.forget(s.id)
				return fmt.Errorf("%s in %s: %w (after %v)", what, s.id, gerr, err)
			}
			if late || !idempotent {
				s.b.forget(s.id)
				return fmt.Errorf("%s in %s: %w", what, s.id, err)
			}
		}
		fresh = true
		if serr := sleep(ctx, backoff(n)); serr != nil {
			return fmt.Errorf("%s in %s: %w (after %v)", what, s.id, serr, err)
		}
	}
}

// ready waits until the sandbox's execd answers its ping. The real server
// reports a new sandbox Running before execd listens, and for about 200 ms
// connections to it are accepted and then dropped; a ping is idempotent,
// so it is sent again through that window (up to RetryFor).
func (s *Sandbox) ready(ctx context.Context) error {
	return s.withExecd(ctx, "wait for execd to answer", true, func(ex *Execd) error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return ex.Ping(pctx)
	})
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
	drop := s.b.takeSpent(s.id)
	cmd := Command{
		Command:   Script(line, timeout, tmp, nonce, stdinFile, s.b.opt.MaxOutput, drop...),
		TimeoutMS: (timeout + 5*time.Second).Milliseconds(),
		UID:       s.b.opt.UID,
		GID:       s.b.opt.GID,
	}
	cctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	var res Result
	err = s.withExecd(cctx, "exec", false, func(ex *Execd) error {
		var rerr error
		res, rerr = ex.Run(cctx, cmd, nil)
		return rerr
	})
	var rep report
	var perr error
	if err != nil && errors.Is(err, ErrIncomplete) && res.ID != "" && cctx.Err() == nil {
		// The stream ended cleanly without the command's end (real execd
		// did once, right after a snapshot): find out how it ended.
		rep, err = s.settle(cctx, res, tmp, nonce)
	} else if err == nil {
		rep, perr = parseReport(res.Stdout, nonce)
	}
	if err == nil && rep.ended {
		// The script ran to its end: it removed the reports it was given,
		// and keeps its own for a later exec to remove.
		s.b.addSpent(s.id, nonce)
	} else {
		s.b.addSpent(s.id, drop...)
	}
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
	_ = s.withExecd(kctx, "end an abandoned exec", true, func(ex *Execd) error {
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

// upload is one POST /files/upload of data to p (not atomic), always to a
// path of its own: it is idempotent, so a connection that broke is tried
// again too (withExecd).
// A large one first waits for a slot of the backend's MaxUploads.
func (s *Sandbox) upload(ctx context.Context, p string, data []byte, mode uint32) error {
	if len(data) >= LargeUpload {
		select {
		case s.b.uploads <- struct{}{}:
			defer func() { <-s.b.uploads }()
		case <-ctx.Done():
			return transportError(ctx, "upload "+p+": wait for a slot", ctx.Err(), false)
		}
	}
	meta := FileMetadata{Path: p, Mode: OctalDigits(mode)}
	return s.withExecd(ctx, "upload "+p, true, func(ex *Execd) error { return ex.Upload(ctx, meta, data) })
}

// Download reads a file of the sandbox (a missing one is
// sandbox.ErrNotFound).
func (s *Sandbox) Download(ctx context.Context, p string) ([]byte, error) {
	return s.DownloadRange(ctx, p, 0, 0)
}

// DownloadRange reads n bytes of a file of the sandbox from offset (n <= 0:
// to its end); a missing file is sandbox.ErrNotFound.
func (s *Sandbox) DownloadRange(ctx context.Context, p string, offset, n int64) ([]byte, error) {
	var data []byte
	err := s.withExecd(ctx, "download "+p, true, func(ex *Execd) error {
		var derr error
		if offset == 0 && n <= 0 {
			data, derr = ex.Download(ctx, p)
		} else {
			data, derr = ex.DownloadRange(ctx, p, offset, n)
		}
		return derr
	})
	return data, err
}

// settle finds out how the Script run with nonce ended when its stream
// ended without the command's final event: from the report lines that
// came before it (the status line is last), or else from the report the
// script keeps (its exit file .x, its .out and .err), read once the
// script has ended (its exit file is there; until then execd's status of
// the command says it runs) and then removed. So such an end is never
// taken for the command's failure, nor for its success. When the report
// cannot be had (execd forgot the command, or it ended without one) the
// error wraps ErrIncomplete and the caller ends what may be left of it.
func (s *Sandbox) settle(ctx context.Context, res Result, tmp, nonce string) (report, error) {
	if rep, perr := parseReport(res.Stdout, nonce); perr == nil && (rep.ended || rep.cancelled || rep.fail != "") {
		return rep, nil
	}
	t := path.Join(tmp, "ngx-"+nonce)
	lost := func(why string) error {
		return fmt.Errorf("exec in %s: %w (command %s), and %s: its outcome is unknown", s.id, ErrIncomplete, res.ID, why)
	}
	for n := 0; ; n++ {
		x, err := s.Download(ctx, t+".x")
		if err == nil {
			return s.readKept(ctx, x, tmp, nonce)
		}
		if !errors.Is(err, sandbox.ErrNotFound) {
			return report{}, err
		}
		var st CommandStatus
		err = s.withExecd(ctx, "the status of command "+res.ID, true, func(ex *Execd) error {
			var serr error
			st, serr = ex.Status(ctx, res.ID)
			return serr
		})
		if errors.Is(err, sandbox.ErrNotFound) {
			return report{}, lost("execd no longer knows the command")
		}
		if err != nil {
			return report{}, err
		}
		if !st.Running {
			// The exit file may have come since the last look.
			if x, err := s.Download(ctx, t+".x"); err == nil {
				return s.readKept(ctx, x, tmp, nonce)
			}
			return report{}, lost("it ended without its exit file")
		}
		if err := sleep(ctx, backoff(n)); err != nil {
			return report{}, err
		}
	}
}

// readKept reads the report a Script kept: its exit file x, and its
// output files (up to Options.MaxOutput each), then removes them.
func (s *Sandbox) readKept(ctx context.Context, x []byte, tmp, nonce string) (report, error) {
	rep, err := parseReport(x, nonce)
	if err != nil || !rep.ended {
		return rep, fmt.Errorf("exec in %s: the command's exit file holds %.100q: %v", s.id, x, err)
	}
	t := path.Join(tmp, "ngx-"+nonce)
	max := s.b.opt.MaxOutput
	for _, f := range []struct {
		name string
		to   *[]byte
	}{{"stdout", &rep.stdout}, {"stderr", &rep.stderr}} {
		suffix := ".out"
		if f.name == "stderr" {
			suffix = ".err"
		}
		data, err := s.DownloadRange(ctx, t+suffix, 0, max+1)
		if errors.Is(err, sandbox.ErrNotFound) {
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("exec in %s: read the command's kept %s: %w", s.id, f.name, err)
		}
		if int64(len(data)) > max {
			rep.big = strings.TrimSpace(fmt.Sprintf("%s %s is more than %d bytes", rep.big, f.name, max))
			continue
		}
		*f.to = data
	}
	// Read: a later exec removes it, as the report of any exec.
	return rep, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
