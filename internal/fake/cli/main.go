// Command fakecli (internal/fake/cli) is a fake `docker` and `kubectl` (which one is decided by
// the name it is run under): the subcommands the docker and kubectl
// sandbox backends use, run for real on this machine. A container or pod
// is a folder (a local sandbox under $FAKECLI_BASE) that every command
// run in it sees at one fixed path ($FAKECLI_MOUNT, default /sandbox)
// through a mount namespace of its own, as root; a docker image is a copy
// of such a folder. Removing a container or pod kills every process
// running in it. As with the real clients, killing the client does not
// end what it started, and stdin reaches the command only with -i.
//
// The messages and exit codes of failures are the real clients' ("Error
// response from daemon: No such container: NAME", `Error from server
// (NotFound): pods "NAME" not found`, "error: unknown flag: --x"). With
// $FAKECLI_BASE/down present, every call fails as when the daemon or API
// server cannot be reached. A command line the real client would take but
// the fake does not model fails with exit 2 and a "fakecli:" message.
//
// docker: exec [-i] [-u USER] [-w DIR] [-e K=V]... CONTAINER CMD...;
// run -d --name NAME [flags] IMAGE [CMD...]; commit [-c CHANGE]...
// CONTAINER [REF]; container inspect -f FORMAT NAME; rm -f NAME; rmi [-f]
// REF|ID...; image inspect [-f {{.Id}}] REF...; images [-a] [-q]
// [--no-trunc] [--filter dangling=B|label=K[=V]]... The images behave as
// a daemon's do (see state): labels, tags taken over by a new commit, and
// an image a container uses only untagged by rmi -f.
//
// kubectl: the lines kubectl.go describes (exec, run, wait, get, delete
// pod), parsed as kubectl parses them.
package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// shimArg, as the first argument, runs fakecli as the shim (see shim).
const shimArg = "__fakecli-shim"

func main() {
	if len(os.Args) > 2 && os.Args[1] == shimArg {
		shim(os.Args[2:])
	}
	base := os.Getenv("FAKECLI_BASE")
	if base == "" || !filepath.IsAbs(base) {
		fail(2, "fakecli: FAKECLI_BASE must name an absolute folder")
	}
	mp := os.Getenv("FAKECLI_MOUNT")
	if mp == "" {
		mp = local.DefaultMountPoint
	}
	store, err := local.New(base, local.Options{Isolation: local.IsolationNamespace, MountPoint: mp})
	if err != nil {
		fail(2, "fakecli: %v", err)
	}
	note("call", os.Args...)
	c := &cli{store: store, base: base, args: os.Args[1:]}
	name := filepath.Base(os.Args[0])
	down := false
	if _, err := os.Stat(filepath.Join(base, "down")); err == nil {
		down = true
	}
	switch name {
	case "docker":
		if down {
			fail(1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?")
		}
		c.docker()
	case "kubectl":
		if down {
			fail(1, "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?\nUnable to connect to the server: dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		c.kubectl()
	default:
		fail(2, "fakecli: run me as docker or kubectl, not %s", name)
	}
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(code)
}

// LogEnv names a file (optional) where every call is noted as a line
// "call ARGV", and every refused command line as "refused ARGV MESSAGE"
// (Go-quoted words): what the real client would refuse, or what the fake
// does not model. A test reads it to prove a backend sends only command
// lines the real client takes.
const LogEnv = "FAKECLI_LOG"

// note appends a line to the $FAKECLI_LOG file.
func note(kind string, words ...string) {
	file := os.Getenv(LogEnv)
	if file == "" {
		return
	}
	line := kind
	for _, w := range words {
		line += " " + strconv.Quote(w)
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fail(2, "fakecli: %s: %v", LogEnv, err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		fail(2, "fakecli: %s: %v", LogEnv, err)
	}
}

// refuse fails for a command line the real client would refuse (or the
// fake does not model), noting it (see LogEnv).
func refuse(code int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	note("refused", append(append([]string(nil), os.Args...), msg)...)
	fail(code, "%s", msg)
}

type cli struct {
	store *local.Backend
	base  string
	args  []string
}

// exec runs argv in the sandbox id, in a mount namespace of its own in
// which the sandbox's folder is bind-mounted at the mount point, and exits
// with its exit code. Its output is relayed as it comes, and its input
// passed on when stdin is attached (-i; otherwise it reads nothing). As
// with the real clients, killing this process does not end what it
// started: that runs in a session of its own under a shim, which keeps
// its output flowing after this process died, as the daemon would.
func (c *cli) exec(id, dir string, env map[string]string, argv []string, stdin, kube bool) {
	if dir == "" {
		dir = "/"
	}
	mp := c.store.MountPoint()
	script := fmt.Sprintf("mount --bind %s %s || exit 125\ncd -- %s || exit 126\nexec \"$@\"",
		sandbox.Quote(c.store.HostPath(id)), sandbox.Quote(mp), sandbox.Quote(dir))
	self, err := os.Executable()
	if err != nil {
		fail(126, "fakecli: %v", err)
	}
	cmd := exec.Command(self, append([]string{shimArg, "unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh"}, argv...)...)
	cmd.Dir = "/"
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	cmd.Env = []string{"PATH=" + path, "LANG=C.UTF-8", "HOME=" + mp + "/home"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// Wrapped, so that the output is relayed through pipes of this
	// process (not handed down as its own descriptors).
	if stdin {
		cmd.Stdin = struct{ io.Reader }{os.Stdin}
	}
	cmd.Stdout = struct{ io.Writer }{os.Stdout}
	cmd.Stderr = struct{ io.Writer }{os.Stderr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		fail(126, "fakecli: exec in %s: %v", id, err)
	}
	_ = cmd.Wait()
	code := exitCode(cmd)
	if kube && code != 0 {
		fmt.Fprintf(os.Stderr, "command terminated with exit code %d\n", code)
	}
	os.Exit(code)
}

func (c *cli) exists(id string) bool {
	fi, err := os.Stat(c.store.HostPath(id))
	return err == nil && fi.IsDir()
}

// remove removes the sandbox's folder (renamed away first, so it is gone
// at once) and kills every process running in it.
func (c *cli) remove(id string) {
	fi, err := os.Stat(c.store.HostPath(id))
	if err != nil {
		fail(1, "fakecli: %v", err)
	}
	gone := filepath.Join(c.base, ".removing-"+id+"-"+strconv.Itoa(os.Getpid()))
	if err := os.Rename(c.store.HostPath(id), gone); err != nil {
		fail(1, "fakecli: %v", err)
	}
	fakeexecd.KillInFolder(fi, c.store.MountPoint())
	if err := os.RemoveAll(gone); err != nil {
		fail(1, "fakecli: %v", err)
	}
}

// exitCode is how a finished command ended: its exit code, 128+N for
// signal N, -1 unknown.
func exitCode(cmd *exec.Cmd) int {
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled():
			return 128 + int(ws.Signal())
		case ws.Exited():
			return ws.ExitStatus()
		}
	}
	return -1
}

// shim runs argv as a container runtime does for the daemon, and exits
// with its exit code: its output is relayed to the shim's stdout and
// stderr for as long as the client reads them, and dropped once the
// client is gone, so the command runs on (and the markers it prints do not
// kill it) after the client died.
func shim(argv []string) {
	// Handled (not ignored, which the command would inherit): a write to
	// a gone client is then an error, not death.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = os.Stdin
	cmd.Stdout = &lenient{w: os.Stdout}
	cmd.Stderr = &lenient{w: os.Stderr}
	if err := cmd.Start(); err != nil {
		fail(126, "fakecli: %v", err)
	}
	_ = cmd.Wait()
	os.Exit(exitCode(cmd))
}

// lenient writes to w until a write fails, then drops what comes.
type lenient struct {
	w      io.Writer
	broken bool
}

func (l *lenient) Write(p []byte) (int, error) {
	if !l.broken {
		if _, err := l.w.Write(p); err != nil {
			l.broken = true
		}
	}
	return len(p), nil
}
