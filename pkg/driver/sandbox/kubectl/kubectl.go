// Package kubectl is the sandbox backend for Kubernetes pods, reached by
// shelling out to kubectl: `kubectl exec -i -n NS POD [-c CONTAINER] --
// sh -c SCRIPT` runs a command, and an upload is piped through stdin. A
// descriptor's sandbox id is "namespace/pod" or "namespace/pod/container"
// (a bare "pod" is in Options.Namespace).
//
// Killing kubectl does not kill what it started in the pod, so every
// command's timeout is enforced inside with `timeout -s KILL`; when the
// driver's context ends, kubectl is killed by its own process group and
// the command in the pod by a second exec that finds it by its random tag
// (even when kubectl died before the command's start reached it). The
// script marks its start and its end (with the exit code) on stderr under
// a random word, so a command that exited non-zero is told apart from
// kubectl failing (NotFound: sandbox.ErrGone; Unauthorized, Forbidden:
// sandbox.ErrUnauthorized; Unable to connect to the server:
// sandbox.ErrTransport) and from a connection that broke mid-command. All
// of that is package cliexec, shared with the docker backend; this
// package supplies kubectl's command lines.
//
// For an owner that lends pods the backend also creates them (`kubectl
// run`, then `kubectl wait` until Ready), removes them (`kubectl delete
// pod`), and snapshots and forks them the portable way: a snapshot is a
// tar of the pod's ngharness folders (Options.SnapshotPaths: the root and
// the workdir) streamed to a file on the owner's machine, and a fork is a
// new pod into which that tar is unpacked at the same paths.
package kubectl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/cliexec"
)

// Name is the provider name descriptors use.
const Name = "kubectl"

// Defaults of Options.
const (
	DefaultNamespace = "default"
	DefaultRoot      = sandbox.DefaultRoot
	DefaultWorkdir   = sandbox.DefaultWorkdir
	// Label marks the pods the backend created.
	Label = "app.kubernetes.io/managed-by=ngharness"
)

// Options configure a Backend. The json tags are the keys of its section
// of ngdriver's config (backends.kubectl, read by config.DecodeSection).
type Options struct {
	// Binary is kubectl (default "kubectl", found on PATH).
	Binary string `json:"binary"`
	// Args go before every command (e.g. --context NAME, --kubeconfig F).
	Args []string `json:"args"`
	// Env is added to kubectl's environment (e.g. KUBECONFIG=...).
	Env []string `json:"env"`
	// Namespace is the namespace of a sandbox id without one (default
	// "default") and of the pods the backend creates.
	Namespace string `json:"namespace"`
	// Container is the container of a sandbox id without one ("": the
	// pod's default container).
	Container string `json:"container"`
	// Root is where ngharness keeps its files in every pod (default
	// /var/lib/ngharness).
	Root string `json:"root"`
	// Workdir is the task's folder when a descriptor names none (default
	// /workspace).
	Workdir string `json:"workdir"`

	// What an owner's pods are made of.

	// Image is a new pod's image (Create).
	Image string `json:"image"`
	// RunArgs are added to `kubectl run` (e.g. --overrides=JSON with
	// resources, --labels=...).
	RunArgs []string `json:"run_args"`
	// Command keeps a pod running (default sleep infinity).
	Command []string `json:"command"`
	// ReadyTimeout bounds the wait for a new pod to be Ready (default 5
	// min).
	ReadyTimeout time.Duration `json:"ready_timeout"`
	// SnapshotDir is the folder on this machine holding snapshots (tar
	// files). Required to snapshot.
	SnapshotDir string `json:"snapshot_dir"`
	// SnapshotPaths are the folders a snapshot keeps (default the root and
	// the workdir).
	SnapshotPaths []string `json:"snapshot_paths"`
}

// Backend reaches pods through kubectl. Its methods are safe for
// concurrent use.
type Backend struct {
	opt Options
	cli *cliexec.Client
}

var classes = cliexec.Classes{
	Gone:         []string{"(NotFound)", "not found", "container not found", "is terminated", "cannot exec into a container in a completed pod", "pod is not running"},
	Unauthorized: []string{"(Unauthorized)", "(Forbidden)", "You must be logged in", "forbidden:"},
	Transport:    []string{"Unable to connect to the server", "connection refused", "i/o timeout", "TLS handshake timeout", "lost connection", "error dialing backend"},
}

// New makes a backend. kubectl is looked up on PATH now.
func New(opt Options) (*Backend, error) {
	if opt.Binary == "" {
		opt.Binary = "kubectl"
	}
	bin, err := exec.LookPath(opt.Binary)
	if err != nil {
		return nil, fmt.Errorf("kubectl: the client %q: %w", opt.Binary, err)
	}
	if opt.Namespace == "" {
		opt.Namespace = DefaultNamespace
	}
	if opt.Root, opt.Workdir, err = sandbox.Folders(opt.Root, opt.Workdir); err != nil {
		return nil, fmt.Errorf("kubectl: %w", err)
	}
	if len(opt.Command) == 0 {
		opt.Command = []string{"sleep", "infinity"}
	}
	if opt.ReadyTimeout <= 0 {
		opt.ReadyTimeout = 5 * time.Minute
	}
	if len(opt.SnapshotPaths) == 0 {
		opt.SnapshotPaths = []string{opt.Root, opt.Workdir}
	}
	for _, p := range opt.SnapshotPaths {
		if !path.IsAbs(p) || path.Clean(p) == "/" {
			return nil, fmt.Errorf("kubectl: snapshot path %q is not an absolute folder below /", p)
		}
	}
	if opt.SnapshotDir != "" && !filepath.IsAbs(opt.SnapshotDir) {
		return nil, fmt.Errorf("kubectl: the snapshot folder %q is not absolute", opt.SnapshotDir)
	}
	return &Backend{opt: opt, cli: &cliexec.Client{Name: Name, Path: bin, Args: opt.Args, Env: opt.Env, Classes: classes}}, nil
}

// Name is "kubectl".
func (b *Backend) Name() string { return Name }

// Client is the path of kubectl.
func (b *Backend) Client() string { return b.cli.Path }

// Ref is a pod (and container) a sandbox id names.
type Ref struct {
	Namespace, Pod, Container string
}

// ID is the sandbox id of the ref: namespace/pod[/container].
func (r Ref) ID() string {
	id := r.Namespace + "/" + r.Pod
	if r.Container != "" {
		id += "/" + r.Container
	}
	return id
}

// ParseID reads "pod", "namespace/pod" or "namespace/pod/container"; each
// part must be a Kubernetes name (lowercase letters, digits, '-', '.').
func (b *Backend) ParseID(id string) (Ref, error) {
	parts := strings.Split(id, "/")
	var r Ref
	switch len(parts) {
	case 1:
		r = Ref{Namespace: b.opt.Namespace, Pod: parts[0]}
	case 2:
		r = Ref{Namespace: parts[0], Pod: parts[1]}
	case 3:
		r = Ref{Namespace: parts[0], Pod: parts[1], Container: parts[2]}
	default:
		return Ref{}, fmt.Errorf("kubectl: sandbox id %q is not namespace/pod[/container]", id)
	}
	if r.Container == "" {
		r.Container = b.opt.Container
	}
	for what, v := range map[string]string{"namespace": r.Namespace, "pod": r.Pod, "container": r.Container} {
		if v == "" && what == "container" {
			continue
		}
		if err := checkName(v); err != nil {
			return Ref{}, fmt.Errorf("kubectl: sandbox id %q: the %s %w", id, what, err)
		}
	}
	return r, nil
}

// checkName accepts a DNS-1123 name (at most 253 bytes of lowercase
// letters, digits, '-' and '.', starting and ending alphanumeric).
func checkName(v string) error {
	if v == "" || len(v) > 253 {
		return fmt.Errorf("%q is empty or too long", v)
	}
	for i, r := range v {
		alnum := r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		if !alnum && !(r == '-' || r == '.') || (i == 0 || i == len(v)-1) && !alnum {
			return fmt.Errorf("%q is not a Kubernetes name (lowercase letters, digits, '-', '.')", v)
		}
	}
	return nil
}

// Connect returns the pod a descriptor names. It does not call kubectl: a
// pod that does not exist is found by the first exec (sandbox.ErrGone).
func (b *Backend) Connect(ctx context.Context, d sandbox.Descriptor) (sandbox.Sandbox, error) {
	if d.Provider != "" && d.Provider != Name {
		return nil, fmt.Errorf("kubectl: the descriptor names provider %q, not %q", d.Provider, Name)
	}
	r, err := b.ParseID(d.SandboxID)
	if err != nil {
		return nil, err
	}
	if d.Workdir != "" && !path.IsAbs(d.Workdir) {
		return nil, fmt.Errorf("kubectl: the descriptor's workdir %q is not an absolute path", d.Workdir)
	}
	return b.open(d.SandboxID, r, d.Workdir), nil
}

// open is the pod (container) r, reached by the exec shape
//
//	kubectl exec -i -n NS POD [-c CONTAINER] -- sh -c SCRIPT
func (b *Backend) open(id string, r Ref, workdir string) *Sandbox {
	if workdir == "" {
		workdir = b.opt.Workdir
	}
	return &Sandbox{cliexec.NewSandbox(b.cli, id, b.opt.Root, workdir, cliexec.Shape{
		ExecArgs: func(script string) []string {
			args := []string{"exec", "-i", "-n", r.Namespace, r.Pod}
			if r.Container != "" {
				args = append(args, "-c", r.Container)
			}
			return append(args, "--", "sh", "-c", script)
		},
		Exists: func(ctx context.Context) error { return b.running(ctx, r) },
	})}
}

// Sandbox is one pod (container), its id namespace/pod[/container] as the
// descriptor named it. It implements sandbox.Sandbox: Exec runs
//
//	kubectl exec -i -n NS POD [-c CONTAINER] -- sh -c SCRIPT
//
// where SCRIPT runs `cd -- DIR && K=V exec ARGV` (every word quoted)
// under `timeout -s KILL`, between the markers that report its exit code;
// Upload pipes the data through kubectl's stdin into a temporary file that
// is then renamed over the path.
type Sandbox struct {
	*cliexec.Sandbox
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// running is nil when the pod runs, an error wrapping sandbox.ErrGone
// when it does not exist or has ended.
func (b *Backend) running(ctx context.Context, r Ref) error {
	phase, err := b.cli.Output(ctx, "get", "pod", r.Pod, "-n", r.Namespace, "-o", "jsonpath={.status.phase}")
	if err != nil {
		return err
	}
	switch phase {
	case "Running", "Pending":
		return nil
	}
	return fmt.Errorf("kubectl: pod %s/%s is %s: %w", r.Namespace, r.Pod, phase, sandbox.ErrGone)
}

// The lending side (sandbox.Lender).

// Create runs a new pod of Options.Image called name in Options.Namespace,
// waits until it is Ready and makes its root and workdir folders. Its id
// is namespace/name.
func (b *Backend) Create(ctx context.Context, name string) (sandbox.Sandbox, error) {
	if b.opt.Image == "" {
		return nil, errors.New("kubectl: no image configured for new pods")
	}
	s, err := b.run(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := s.MakeFolders(ctx, b.opt.Root, b.opt.Workdir); err != nil {
		_ = b.Remove(context.WithoutCancel(ctx), s.ID())
		return nil, fmt.Errorf("kubectl: prepare pod %s: %w", s.ID(), err)
	}
	return s, nil
}

func (b *Backend) run(ctx context.Context, name string) (*Sandbox, error) {
	if err := checkName(name); err != nil || len(name) > 63 || strings.Contains(name, ".") {
		return nil, fmt.Errorf("kubectl: pod name %q is not a DNS label (at most 63 lowercase letters, digits and '-')", name)
	}
	r := Ref{Namespace: b.opt.Namespace, Pod: name, Container: b.opt.Container}
	args := []string{"run", name, "-n", r.Namespace, "--image=" + b.opt.Image, "--restart=Never", "--labels=" + Label}
	args = append(args, b.opt.RunArgs...)
	args = append(append(args, "--command", "--"), b.opt.Command...)
	if _, err := b.cli.Output(ctx, args...); err != nil {
		return nil, fmt.Errorf("kubectl: create pod %s/%s: %w", r.Namespace, name, err)
	}
	if _, err := b.cli.Output(ctx, "wait", "--for=condition=Ready", "pod/"+name, "-n", r.Namespace,
		fmt.Sprintf("--timeout=%ds", int(b.opt.ReadyTimeout.Seconds()))); err != nil {
		_ = b.Remove(context.WithoutCancel(ctx), r.ID())
		return nil, fmt.Errorf("kubectl: pod %s/%s did not become ready: %w", r.Namespace, name, err)
	}
	return b.open(r.ID(), r, ""), nil
}

// Open returns the pod with that id; one that does not exist or has ended
// is sandbox.ErrGone.
func (b *Backend) Open(ctx context.Context, id string) (sandbox.Sandbox, error) {
	r, err := b.ParseID(id)
	if err != nil {
		return nil, err
	}
	if err := b.running(ctx, r); err != nil {
		return nil, err
	}
	return b.open(id, r, ""), nil
}

// snapshotFile is the tar file of the snapshot called name.
func (b *Backend) snapshotFile(name string) (string, error) {
	if b.opt.SnapshotDir == "" {
		return "", errors.New("kubectl: no snapshot folder configured")
	}
	plain := name != "" && len(name) <= 200 && name[0] != '.'
	for _, r := range name {
		plain = plain && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
	}
	if !plain {
		return "", fmt.Errorf("kubectl: snapshot name %q is not a plain name (letters, digits, '.', '_', '-')", name)
	}
	return filepath.Join(b.opt.SnapshotDir, name+".tar"), nil
}

// snapshotTries is how many times a snapshot's tar is taken when files
// changed while it read them.
const snapshotTries = 3

// Snapshot streams a tar of the pod's SnapshotPaths to SnapshotDir/NAME.tar
// (written under a temporary name, then renamed, replacing an earlier
// one) and returns name, the snapshot's id.
func (b *Backend) Snapshot(ctx context.Context, sandboxID, name string) (string, error) {
	file, err := b.snapshotFile(name)
	if err != nil {
		return "", err
	}
	r, err := b.ParseID(sandboxID)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(b.opt.SnapshotDir, 0o755); err != nil {
		return "", fmt.Errorf("kubectl: snapshot %s: %w", sandboxID, err)
	}
	tmp, err := os.CreateTemp(b.opt.SnapshotDir, ".snap-*")
	if err != nil {
		return "", fmt.Errorf("kubectl: snapshot %s: %w", sandboxID, err)
	}
	defer os.Remove(tmp.Name())
	words := []string{"tar", "-C", "/", "-cf", "-", "--"}
	for _, p := range b.opt.SnapshotPaths {
		words = append(words, strings.TrimPrefix(path.Clean(p), "/"))
	}
	line := sandbox.QuoteArgv(words)
	s := b.open(sandboxID, r, "")
	var res sandbox.ExecResult
	for try := 1; ; try++ {
		res, err = s.ExecTo(ctx, line, 30*time.Minute, nil, tmp)
		// GNU tar exits 1 when something changed while it read it (an
		// exec's fence file made in the root as the tar listed it): the
		// archive may hold a torn file, so it is taken again, from the
		// start, a few times; the paused launch itself does not move.
		if err != nil || res.ExitCode != 1 || !bytes.Contains(res.Stderr, []byte("file changed as we read it")) || try == snapshotTries {
			break
		}
		if _, err = tmp.Seek(0, io.SeekStart); err == nil {
			err = tmp.Truncate(0)
		}
		if err != nil {
			break
		}
	}
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("tar exited %d: %s", res.ExitCode, cliexec.Tail(res.Stderr))
	}
	if err != nil {
		return "", fmt.Errorf("kubectl: snapshot pod %s: %w", sandboxID, err)
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return "", fmt.Errorf("kubectl: snapshot pod %s: %w", sandboxID, err)
	}
	return name, nil
}

// Fork runs a new pod called name and unpacks the snapshot's tar into it
// at the same paths.
func (b *Backend) Fork(ctx context.Context, snapshotID, name string) (sandbox.Sandbox, error) {
	file, err := b.snapshotFile(snapshotID)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("kubectl: fork %s: snapshot %s: %w", name, snapshotID, sandbox.ErrNotFound)
		}
		return nil, fmt.Errorf("kubectl: fork %s: %w", name, err)
	}
	s, err := b.run(ctx, name)
	if err != nil {
		return nil, err
	}
	res, err := s.ExecTo(ctx, sandbox.QuoteArgv([]string{"tar", "-C", "/", "-xpf", "-"}), 30*time.Minute, bytes.NewReader(data), nil)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("tar exited %d: %s", res.ExitCode, cliexec.Tail(res.Stderr))
	}
	if err != nil {
		_ = b.Remove(context.WithoutCancel(ctx), s.ID())
		return nil, fmt.Errorf("kubectl: fork %s from snapshot %s: %w", s.ID(), snapshotID, err)
	}
	return s, nil
}

// Remove deletes the pod at once (its processes end with it). Removing
// one that does not exist is not an error.
func (b *Backend) Remove(ctx context.Context, id string) error {
	r, err := b.ParseID(id)
	if err != nil {
		return err
	}
	if _, err := b.cli.Output(ctx, "delete", "pod", r.Pod, "-n", r.Namespace, "--grace-period=0", "--force", "--ignore-not-found", "--wait=false"); err != nil && !errors.Is(err, sandbox.ErrGone) {
		return fmt.Errorf("kubectl: delete pod %s: %w", id, err)
	}
	return nil
}

// RemoveSnapshot deletes a snapshot's tar. Removing one that does not
// exist is not an error.
func (b *Backend) RemoveSnapshot(ctx context.Context, id string) error {
	file, err := b.snapshotFile(id)
	if err != nil {
		return err
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kubectl: remove snapshot %s: %w", id, err)
	}
	return nil
}
