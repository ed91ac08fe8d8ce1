package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// tagVar is set (through req.Env) on every command a test starts, so a pid
// read back from a command can be checked to be one of the test's own
// processes before it is ever signalled.
const tagVar = "NGH_LOCAL_TEST_TAG"

func newTag() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// mode is one isolation a test runs under.
type mode struct {
	name string
	opt  Options
}

// modes returns "none", plus "namespace" when running as root (a test
// that needs the namespace uses nsBackend).
func modes(t *testing.T) []mode {
	out := []mode{{name: "none", opt: Options{Isolation: IsolationNone}}}
	if os.Geteuid() == 0 {
		out = append(out, mode{name: "namespace", opt: Options{Isolation: IsolationNamespace}})
	} else {
		t.Logf("not root: the namespace variants are skipped")
	}
	return out
}

// newBackend makes a backend in a temporary folder; with namespace
// isolation its mount point is a temporary folder too.
func newBackend(t *testing.T, opt Options) *Backend {
	t.Helper()
	if opt.Isolation == IsolationNamespace && opt.MountPoint == "" {
		opt.MountPoint = filepath.Join(t.TempDir(), "mnt")
	}
	b, err := New(t.TempDir(), opt)
	if err != nil {
		if opt.Isolation == IsolationNamespace {
			t.Skipf("namespace isolation unavailable here: %v", err)
		}
		t.Fatal(err)
	}
	return b
}

// nsBackend is a backend with namespace isolation, or skips the test.
func nsBackend(t *testing.T) *Backend {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: mount namespaces need root (run the suite as root to test them)")
	}
	return newBackend(t, Options{Isolation: IsolationNamespace})
}

func create(t *testing.T, b *Backend, id string) *Sandbox {
	t.Helper()
	sb, err := b.Create(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func run(t *testing.T, sb *Sandbox, req sandbox.ExecRequest) sandbox.ExecResult {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	res, err := sb.Exec(context.Background(), req)
	if err != nil {
		t.Fatalf("exec %.200q: %v (stderr %q)", req.Argv, err, res.Stderr)
	}
	return res
}

func sh(t *testing.T, sb *Sandbox, script string) sandbox.ExecResult {
	t.Helper()
	res := run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}})
	if res.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit %d, stderr %q", script, res.ExitCode, res.Stderr)
	}
	return res
}

// proc is a process a test started, held by a pidfd so that signalling it
// can never hit another process that reused its pid.
type proc struct {
	pid, fd int
}

// adopt takes hold of pid, checks that it carries tag in its environment
// (it is one of this test's processes) and kills it when the test ends.
func adopt(t *testing.T, pid int, tag string) *proc {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	p := &proc{pid: pid, fd: fd}
	// The environment reads empty while the process is in the middle of an
	// execve: look again until it carries the tag or the process is gone.
	// Only this test's processes carry its tag.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if v, ok := proctest.Env(pid, tagVar); ok && v == tag {
			break
		}
		if !p.alive() || time.Now().After(deadline) {
			unix.Close(fd)
			t.Fatalf("pid %d is not one of this test's processes", pid)
		}
	}
	t.Cleanup(func() {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		p.waitExit(10 * time.Second)
		unix.Close(fd)
	})
	return p
}

// waitExit reports whether the process ended within d.
func (p *proc) waitExit(d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for {
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms < 0 {
			ms = 0
		}
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

func (p *proc) alive() bool { return !p.waitExit(0) }

// waitFile waits until the host file p holds whole lines, and returns its
// content.
func waitFile(t *testing.T, p string) []byte {
	t.Helper()
	var b []byte
	testkit.Eventually(t, p+" written", func() (bool, string) {
		var err error
		b, err = os.ReadFile(p)
		return err == nil && len(b) > 0 && bytes.HasSuffix(b, []byte("\n")), fmt.Sprintf("%q %v", b, err)
	})
	return b
}

func readPid(t *testing.T, p string) int {
	t.Helper()
	b := waitFile(t, p)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return pid
}

// hostile are strings that would run something or split if a shell ever
// saw them unquoted; each marker names a file they would create.
func hostile(marker string) []string {
	return []string{
		"$(touch " + marker + ")",
		"`touch " + marker + "`",
		"; touch " + marker,
		"&& touch " + marker + " #",
		"| touch " + marker,
		"'; touch " + marker + "; '",
		`"; touch ` + marker + `; "`,
		"\\",
		"a\nb\ttouch " + marker,
		"*", "~", "$HOME", "${PATH}", "-n", "--", "",
		"ünïcödé ✓ 日本",
		"\xff\xfe invalid utf-8",
	}
}

func assertNoFile(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s exists: a hostile string was executed", p)
	}
}
