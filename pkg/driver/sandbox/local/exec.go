package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// DefaultTimeout bounds a command whose request sets no timeout.
const DefaultTimeout = 10 * time.Minute

// ioGrace is how long Exec waits, after the command exited, for processes
// it left behind to close its stdout and stderr (a well-behaved detached
// process redirects them at once). It is generous because a process the
// driver forks at the same moment holds the pipes until its exec, which
// under heavy load (hundreds of launches at once) can take seconds: cutting
// the wait short loses output the command did write.
const ioGrace = 5 * time.Second

// maxArgLen is Linux's limit on one argument (MAX_ARG_STRLEN), which the
// whole `sh -c` script must fit in.
const maxArgLen = 32 * 4096

// setupFailed is the exit code of the namespace script when the bind mount
// failed (the command never ran).
const setupFailed = 125

// Sandbox is one sandbox of a local Backend. It implements sandbox.Sandbox;
// its methods are safe for concurrent use.
type Sandbox struct {
	b       *Backend
	id      string
	host    string // the folder on this machine
	inside  string // where the folder appears inside (mount point, or host)
	workdir string
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// ID is the sandbox's id.
func (s *Sandbox) ID() string { return s.id }

// HostPath is the sandbox's folder on this machine.
func (s *Sandbox) HostPath() string { return s.host }

// Root is <mountpoint>/.ngharness (the host folder's .ngharness without
// namespace isolation).
func (s *Sandbox) Root() string { return filepath.Join(s.inside, RootFolder) }

// Workdir is <mountpoint>/work (the host folder's work without namespace
// isolation), or the workdir of the descriptor it was connected with.
func (s *Sandbox) Workdir() string { return s.workdir }

// Inside is where the sandbox's folder appears to its commands: the mount
// point, or the host folder without namespace isolation.
func (s *Sandbox) Inside() string { return s.inside }

// BatchKey implements sandbox.HostBatcher: every sandbox of the backend
// (named by its base folder) runs its HostPaths commands on this machine,
// where each one's HostPathOf reaches it.
func (s *Sandbox) BatchKey() string { return "local:" + s.b.base }

var _ sandbox.HostBatcher = (*Sandbox)(nil)

// HostPathOf maps a path inside the sandbox to the host path it is at (a
// shared tool's path is its host path already). It is an error if p is not
// absolute or not below Inside() or the tools folder.
func (s *Sandbox) HostPathOf(p string) (string, error) {
	if c := filepath.Clean(p); strings.HasPrefix(c, s.b.toolsDir()+"/") && strings.IndexByte(c, 0) < 0 {
		return c, nil // a shared tool: the same path everywhere (tools.go)
	}
	rel, err := s.relInside(p)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.host, rel), nil
}

func (s *Sandbox) relInside(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("sandbox %s: path %q is not absolute", s.id, p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("sandbox %s: path %q holds a NUL byte", s.id, p)
	}
	c := filepath.Clean(p)
	if !strings.HasPrefix(c, s.inside+"/") {
		return "", fmt.Errorf("sandbox %s: path %q is not inside the sandbox's folder %s", s.id, p, s.inside)
	}
	return c[len(s.inside)+1:], nil
}

// Upload writes data to path (absolute, inside the sandbox's folder) with
// mode, creating the folders above it, replacing any file there. The file
// is written on the host atomically (temporary file, then rename). A
// symlink that would lead the write out of the sandbox's folder is refused.
func (s *Sandbox) Upload(ctx context.Context, path string, data []byte, mode uint32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rel, err := s.relInside(path)
	if err != nil {
		return fmt.Errorf("local: upload: %w", err)
	}
	if err := s.b.exists(s.id); err != nil {
		return err
	}
	if err := writeBeneath(s.host, rel, data, mode); err != nil {
		return fmt.Errorf("local: upload %s to sandbox %s: %w", path, s.id, err)
	}
	return nil
}

// env is the command's base environment, as KEY=VALUE.
func (s *Sandbox) env() []string {
	m := s.b.env
	out := make([]string, 0, len(m)+1)
	if _, ok := m["HOME"]; !ok {
		out = append(out, "HOME="+filepath.Join(s.inside, HomeFolder))
	}
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// Exec runs req in the sandbox and waits for it. With namespace isolation
// the host runs
//
//	unshare --mount --propagation private -- /bin/sh -c 'mount --bind -o ro TOOLS TOOLS; mount --bind HOST MOUNTPOINT ... ; cd DIR && exec env K=V ... ARGV'
//
// (TOOLS is the backend's shared tools folder, read-only to the command),
// every word quoted; without it, /bin/sh -c 'cd DIR && exec ...'. The
// command gets the backend's base environment plus req.Env, stdin from
// req.Stdin (or /dev/null), and the sandbox's Workdir when req.Dir is empty
// (a relative req.Dir is taken from the Workdir). It runs in a process group
// of its own: when req.Timeout (default 10 min) runs out or ctx ends, that
// group, and only it, is killed (SIGKILL), and the error wraps
// sandbox.ErrTimeout (or ctx.Err()); the output so far is returned with it.
// Processes that left the group (setsid) are not touched and keep the
// sandbox's namespace. Once the command has exited, Exec waits at most 2 s
// for processes it left behind to close its stdout and stderr (a detached
// process should redirect them). With namespace isolation, a bind mount
// that fails is an error (the command never ran), not an exit code.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: %w", s.id, err)
	}
	if req.Dir == "" {
		req.Dir = s.workdir
	} else if !filepath.IsAbs(req.Dir) {
		req.Dir = filepath.Join(s.workdir, req.Dir)
	}
	line, err := sandbox.CommandLine(req)
	if err != nil {
		return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: %w", s.id, err)
	}
	if strings.IndexByte(line, 0) >= 0 {
		return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: the argv, environment or folder holds a NUL byte", s.id)
	}
	if err := s.b.exists(s.id); err != nil {
		return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: %w", s.id, err)
	}
	// A shared tool the command names (ngsup as its first word, ngresume
	// as the harness ngsup runs) runs only as the content installed.
	for _, a := range req.Argv {
		if err := s.b.checkTool(a); err != nil {
			return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: %w", s.id, err)
		}
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}

	ns := s.b.mountPoint != ""
	if n := len(line) + 512 + len(s.host) + len(s.b.mountPoint); n >= maxArgLen {
		return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: the command line is %d bytes quoted, more than the %d one argument of sh -c may hold: pass large data through Stdin or Upload", s.id, len(line), maxArgLen-512)
	}
	var cmd *exec.Cmd
	var ready *os.File // read end of the "namespace is set up" pipe
	switch {
	case ns && req.HostPaths:
		// A command that touches the sandbox only by the paths in its
		// arguments runs on the host with them translated: no namespace,
		// no shell, a third of the cost (it matters when hundreds of
		// launches are paused at one checkpoint).
		argv := make([]string, len(req.Argv))
		for i, a := range req.Argv {
			argv[i] = s.hostPath(a)
		}
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Dir = s.hostPath(req.Dir)
		cmd.Env = append(s.env(), envList(req.Env)...)
	case ns:
		if err := os.MkdirAll(s.b.mountPoint, 0o755); err != nil {
			return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: create the mount point: %w", s.id, err)
		}
		// fd 3 says the bind mount is in place; it is closed before the
		// command runs, so the command never sees it.
		// The shared tools are read-only in the namespace (tools.go).
		script := fmt.Sprintf("%[1]s --bind -o ro %[2]s %[2]s || exit %[5]d\n%[1]s --bind %[3]s %[4]s || exit %[5]d\nprintf ok >&3; exec 3>&-\n%[6]s",
			sandbox.Quote(s.b.mount), sandbox.Quote(s.b.toolsDir()), sandbox.Quote(s.host), sandbox.Quote(s.b.mountPoint), setupFailed, line)
		cmd = exec.Command(s.b.unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script)
		cmd.Dir = "/"
		r, w, err := os.Pipe()
		if err != nil {
			return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: %w", s.id, err)
		}
		defer r.Close()
		defer w.Close()
		cmd.ExtraFiles = []*os.File{w}
		ready = r
	default:
		cmd = exec.Command("/bin/sh", "-c", line)
		cmd.Dir = s.host
	}
	if cmd.Env == nil {
		cmd.Env = s.env()
	}
	cmd.Stdin = req.Stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = ioGrace

	if err := cmd.Start(); err != nil {
		if gerr := s.b.exists(s.id); gerr != nil {
			return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: %w", s.id, gerr)
		}
		return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: start: %w", s.id, err)
	}
	pid := cmd.Process.Pid // also the process group id (Setpgid)
	var readyc chan []byte
	if ready != nil {
		cmd.ExtraFiles[0].Close()
		readyc = make(chan []byte, 1)
		go func() {
			// Read the two bytes, not to EOF: under load a process the
			// driver forks at the same moment may hold the pipe's write
			// end for a while before its exec closes it.
			b := make([]byte, 2)
			n, _ := io.ReadFull(ready, b)
			readyc <- b[:n]
		}()
	}

	// Wait for the command to exit without reaping it: while it is a zombie
	// its pid, which is also its group's id, cannot be reused, so killing
	// the group by that id hits exactly the command's group. Only this pid
	// is waited for (WNOWAIT), so exec.Cmd.Wait still reaps it.
	exited := make(chan error, 1)
	go func() {
		for {
			var info unix.Siginfo
			err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if err != unix.EINTR {
				exited <- err
				return
			}
		}
	}()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var cause error
	select {
	case <-exited:
	case <-timer.C:
		cause = fmt.Errorf("%w after %s", sandbox.ErrTimeout, timeout)
	case <-ctx.Done():
		cause = ctx.Err()
		if errors.Is(cause, context.DeadlineExceeded) {
			cause = fmt.Errorf("%w: %w", sandbox.ErrTimeout, cause)
		}
	}
	if cause != nil {
		_ = unix.Kill(-pid, unix.SIGKILL)
		<-exited
	}
	werr := cmd.Wait()
	res := sandbox.ExecResult{ExitCode: -1, Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), Duration: time.Since(start)}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled():
			res.ExitCode = 128 + int(ws.Signal())
		case ws.Exited():
			res.ExitCode = ws.ExitStatus()
		}
	}
	if cause != nil {
		return res, fmt.Errorf("exec in %s: %w", s.id, cause)
	}
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) && !errors.Is(werr, exec.ErrWaitDelay) {
		return res, fmt.Errorf("exec in %s: %w", s.id, werr)
	}
	if errors.Is(werr, exec.ErrWaitDelay) && req.HostPaths {
		// Nothing a HostPaths command starts should hold its output open;
		// when something did for ioGrace, the pipes were closed under
		// the reader and what it printed may be cut. The command ran:
		// say so, so that a caller sends it again only if that is safe.
		return res, fmt.Errorf("exec in %s: %w: its output was still held open %s after it exited; what it printed may be cut", s.id, sandbox.ErrTransport, ioGrace)
	}
	if readyc != nil {
		var got []byte
		select {
		case got = <-readyc:
		case <-time.After(ioGrace):
		}
		if string(got) != "ok" {
			if err := s.b.exists(s.id); err != nil {
				return res, fmt.Errorf("exec in %s: %w", s.id, err)
			}
			return res, fmt.Errorf("exec in %s: %w: the sandbox's mount namespace was not ready (exit code %d): %s",
				s.id, sandbox.ErrSetup, res.ExitCode, tail(res.Stderr, 2048))
		}
	}
	return res, nil
}

// hostPath translates an absolute path inside the sandbox's view (under
// the mount point) to the sandbox's folder on the host; anything else is
// returned as it is.
func (s *Sandbox) hostPath(p string) string {
	mp := s.b.mountPoint
	switch {
	case mp == "" || !strings.HasPrefix(p, mp):
		return p
	case p == mp:
		return s.host
	case p[len(mp)] == '/':
		return s.host + p[len(mp):]
	}
	return p
}

// envList turns an environment map into KEY=VALUE entries, sorted.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
