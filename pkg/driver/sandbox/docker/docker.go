// Package docker is the sandbox backend for plain containers, reached by
// shelling out to the docker client: `docker exec -i CONTAINER sh -c
// SCRIPT` runs a command, and an upload is piped through stdin. A
// descriptor's sandbox id is the container's name (or id).
//
// Docker cannot kill an exec, so every command's timeout is enforced
// inside the container with `timeout -s KILL`; when the driver's context
// ends, the client is killed by its own process group and the command in
// the container by a second exec that finds it by its random tag (even
// when the client died before the command's start reached it). The
// script marks its start and its end (with the exit code) on stderr under
// a random word, so a command that ran and exited non-zero is told apart
// from a client that failed (No such container: sandbox.ErrGone; Cannot
// connect to the Docker daemon: sandbox.ErrTransport; permission denied:
// sandbox.ErrUnauthorized) and from a connection that broke mid-command.
// All of that is package cliexec, shared with the kubectl backend; this
// package supplies docker's command lines.
//
// For an owner that lends containers the backend also creates them
// (`docker run -d`), snapshots them (`docker commit`: the container's
// files, at the same paths), forks them (`docker run` of the snapshot
// image) and removes them (`docker rm -f`, `docker rmi -f`). Every image
// it commits carries the owner's label; an image that lost its name while
// a fork used it (`rmi -f` then only untags it) or that was committed over
// is removed, by that label, once no container uses it.
package docker

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path"
	"strings"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/cliexec"
)

// Name is the provider name descriptors use.
const Name = "docker"

// Defaults of Options.
const (
	DefaultRoot               = sandbox.DefaultRoot
	DefaultWorkdir            = sandbox.DefaultWorkdir
	DefaultSnapshotRepository = "ngharness-snapshot"
	// Label marks the containers the backend created.
	Label = "io.ngharness.sandbox=1"
	// SnapshotLabel is the key of the label every image a snapshot
	// commits carries, with the owner's name (Options.Owner) as value.
	SnapshotLabel = "io.ngharness.snapshot"
)

// Options configure a Backend. The json tags are the keys of its section
// of ngdriver's config (backends.docker, read by config.DecodeSection).
type Options struct {
	// Binary is the docker client (default "docker", found on PATH).
	Binary string `json:"binary"`
	// Args go before every command (e.g. --context remote, -H ssh://host).
	Args []string `json:"args"`
	// Env is added to the client's environment (e.g. DOCKER_HOST=...).
	Env []string `json:"env"`
	// User runs every command as this user (docker exec -u).
	User string `json:"user"`
	// Root is where ngharness keeps its files in every container (default
	// /var/lib/ngharness); it must be in the container's filesystem (not
	// a volume) for a snapshot to keep it.
	Root string `json:"root"`
	// Workdir is the task's folder when a descriptor names none (default
	// /workspace).
	Workdir string `json:"workdir"`

	// What an owner's containers are made of.

	// Image is a new container's image (Create).
	Image string `json:"image"`
	// RunArgs are added to `docker run` (e.g. --network none, --memory 4g).
	RunArgs []string `json:"run_args"`
	// Command keeps a container running (default sleep infinity).
	Command []string `json:"command"`
	// SnapshotRepository names the images snapshots are committed to
	// (default ngharness-snapshot): a snapshot is REPOSITORY:NAME.
	SnapshotRepository string `json:"snapshot_repository"`
	// Owner names this owner in the label SnapshotLabel=OWNER of every
	// image it commits; it removes only unused images of its own name
	// (default: the SnapshotRepository).
	Owner string `json:"owner"`
}

// Backend reaches containers through the docker client. Its methods are
// safe for concurrent use.
type Backend struct {
	opt Options
	cli *cliexec.Client
}

// classes are the docker client's failures, by error class.
var classes = cliexec.Classes{
	Gone:         []string{"No such container", "No such object", "is not running", "is paused", "is restarting", "marked for removal", "removal in progress"},
	Unauthorized: []string{"permission denied while trying to connect", "unauthorized", "forbidden", "authentication required"},
	Transport:    []string{"Cannot connect to the Docker daemon", "error during connect", "connection refused", "i/o timeout"},
}

// New makes a backend. The client is looked up on PATH now.
func New(opt Options) (*Backend, error) {
	if opt.Binary == "" {
		opt.Binary = "docker"
	}
	bin, err := exec.LookPath(opt.Binary)
	if err != nil {
		return nil, fmt.Errorf("docker: the client %q: %w", opt.Binary, err)
	}
	if opt.Root, opt.Workdir, err = sandbox.Folders(opt.Root, opt.Workdir); err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	if len(opt.Command) == 0 {
		opt.Command = []string{"sleep", "infinity"}
	}
	if opt.SnapshotRepository == "" {
		opt.SnapshotRepository = DefaultSnapshotRepository
	}
	if opt.Owner == "" {
		opt.Owner = opt.SnapshotRepository
	}
	if strings.ContainsAny(opt.Owner, "\n\"'\\ ,") {
		return nil, fmt.Errorf("docker: the owner name %q holds a space, quote, comma or newline", opt.Owner)
	}
	return &Backend{opt: opt, cli: &cliexec.Client{Name: Name, Path: bin, Args: opt.Args, Env: opt.Env, Classes: classes}}, nil
}

// Name is "docker".
func (b *Backend) Name() string { return Name }

// Client is the path of the docker client in use.
func (b *Backend) Client() string { return b.cli.Path }

// CheckName rejects a container name docker would not take.
func CheckName(id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("docker: container name %q: empty or longer than 128 bytes", id)
	}
	for i, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || i > 0 && (r == '_' || r == '.' || r == '-')
		if !ok {
			return fmt.Errorf("docker: container name %q holds %q (allowed: [a-zA-Z0-9][a-zA-Z0-9_.-]*)", id, r)
		}
	}
	return nil
}

// Connect returns the container a descriptor names. It does not call
// docker: a container that does not exist is found by the first exec
// (sandbox.ErrGone).
func (b *Backend) Connect(ctx context.Context, d sandbox.Descriptor) (sandbox.Sandbox, error) {
	if d.Provider != "" && d.Provider != Name {
		return nil, fmt.Errorf("docker: the descriptor names provider %q, not %q", d.Provider, Name)
	}
	if err := CheckName(d.SandboxID); err != nil {
		return nil, err
	}
	if d.Workdir != "" && !path.IsAbs(d.Workdir) {
		return nil, fmt.Errorf("docker: the descriptor's workdir %q is not an absolute path", d.Workdir)
	}
	return b.open(d.SandboxID, d.Workdir), nil
}

// open is the container id, reached by the exec shape
//
//	docker exec -i [-u USER] CONTAINER sh -c SCRIPT
func (b *Backend) open(id, workdir string) *Sandbox {
	if workdir == "" {
		workdir = b.opt.Workdir
	}
	return &Sandbox{cliexec.NewSandbox(b.cli, id, b.opt.Root, workdir, cliexec.Shape{
		ExecArgs: func(script string) []string {
			args := []string{"exec", "-i"}
			if b.opt.User != "" {
				args = append(args, "-u", b.opt.User)
			}
			return append(args, id, "sh", "-c", script)
		},
		Exists: func(ctx context.Context) error { return b.running(ctx, id) },
	})}
}

// Sandbox is one container. It implements sandbox.Sandbox: Exec runs
//
//	docker exec -i CONTAINER sh -c SCRIPT
//
// where SCRIPT runs `cd -- DIR && K=V exec ARGV` (every word quoted)
// under `timeout -s KILL`, between the markers that report its exit code;
// Upload pipes the data through the client's stdin into a temporary file
// that is then renamed over the path.
type Sandbox struct {
	*cliexec.Sandbox
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// running is nil when the container is running, an error wrapping
// sandbox.ErrGone when it does not exist or is not running.
func (b *Backend) running(ctx context.Context, id string) error {
	out, err := b.cli.Output(ctx, "container", "inspect", "-f", "{{.State.Running}}", id)
	if err != nil {
		return err
	}
	if out != "true" {
		return fmt.Errorf("docker: container %s is not running: %w", id, sandbox.ErrGone)
	}
	return nil
}

// The lending side (sandbox.Lender).

// Create runs a new container of Options.Image called name, labelled as
// ngharness's, and makes its root and workdir folders.
func (b *Backend) Create(ctx context.Context, name string) (sandbox.Sandbox, error) {
	if b.opt.Image == "" {
		return nil, errors.New("docker: no image configured for new containers")
	}
	s, err := b.run(ctx, name, b.opt.Image)
	if err != nil {
		return nil, err
	}
	if err := s.MakeFolders(ctx, b.opt.Root, b.opt.Workdir); err != nil {
		_ = b.Remove(context.WithoutCancel(ctx), name)
		return nil, fmt.Errorf("docker: prepare container %s: %w", name, err)
	}
	return s, nil
}

func (b *Backend) run(ctx context.Context, name, image string) (*Sandbox, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	args := []string{"run", "-d", "--name", name, "--label", Label}
	args = append(args, b.opt.RunArgs...)
	args = append(append(args, image), b.opt.Command...)
	if _, err := b.cli.Output(ctx, args...); err != nil {
		return nil, fmt.Errorf("docker: create container %s from %s: %w", name, image, err)
	}
	return b.open(name, ""), nil
}

// Open returns the container with that name; one that does not exist or
// is not running is sandbox.ErrGone.
func (b *Backend) Open(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if err := CheckName(id); err != nil {
		return nil, err
	}
	if err := b.running(ctx, id); err != nil {
		return nil, err
	}
	return b.open(id, ""), nil
}

// SnapshotRef is the image a snapshot called name is committed to.
func (b *Backend) SnapshotRef(name string) string {
	return b.opt.SnapshotRepository + ":" + name
}

// label is the label of the images this owner commits.
func (b *Backend) label() string { return SnapshotLabel + "=" + b.opt.Owner }

// Snapshot commits the container's files to the image REPOSITORY:NAME
// (replacing an earlier one of that name), labelled as this owner's, and
// returns the image's reference, the snapshot's id.
func (b *Backend) Snapshot(ctx context.Context, sandboxID, name string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", fmt.Errorf("docker: snapshot name: %w", err)
	}
	ref := b.SnapshotRef(name)
	if _, err := b.cli.Output(ctx, "commit", "--change", "LABEL "+b.label(), sandboxID, ref); err != nil {
		return "", fmt.Errorf("docker: snapshot container %s: %w", sandboxID, err)
	}
	return ref, nil
}

// Fork runs a new container called name from a snapshot image: the same
// files at the same paths.
func (b *Backend) Fork(ctx context.Context, snapshotID, name string) (sandbox.Sandbox, error) {
	if _, err := b.cli.Output(ctx, "image", "inspect", snapshotID); err != nil {
		if cliexec.Matches([]byte(err.Error()), "No such image") {
			return nil, fmt.Errorf("docker: fork %s: snapshot %s: %w", name, snapshotID, sandbox.ErrNotFound)
		}
		return nil, fmt.Errorf("docker: fork %s: snapshot %s: %w", name, snapshotID, err)
	}
	return b.run(ctx, name, snapshotID)
}

// Remove removes the container (its processes end with it), then the
// images this owner committed that nothing uses any more (see
// RemoveSnapshot). Removing one that does not exist is not an error.
func (b *Backend) Remove(ctx context.Context, id string) error {
	if _, err := b.cli.Output(ctx, "rm", "-f", id); err != nil && !errors.Is(err, sandbox.ErrGone) {
		return fmt.Errorf("docker: remove container %s: %w", id, err)
	}
	return b.sweep(ctx)
}

// RemoveSnapshot removes a snapshot's name. Its image goes at once unless
// a container (a fork) still uses it: docker then only untags it, and it
// goes with the last container that uses it (Remove). Removing one that
// does not exist is not an error.
func (b *Backend) RemoveSnapshot(ctx context.Context, id string) error {
	if _, err := b.cli.Output(ctx, "rmi", "-f", id); err != nil && !cliexec.Matches([]byte(err.Error()), "No such image") {
		return fmt.Errorf("docker: remove snapshot %s: %w", id, err)
	}
	return b.sweep(ctx)
}

// sweep removes the images this owner committed that have lost their
// name (a snapshot removed while a fork used it, or committed again under
// the same name) and that no container uses: `docker rmi` without -f
// refuses an image a container uses, and such an image is swept later.
func (b *Backend) sweep(ctx context.Context) error {
	out, err := b.cli.Output(ctx, "images", "-a", "-q", "--no-trunc", "--filter", "label="+b.label(), "--filter", "dangling=true")
	if err != nil {
		return fmt.Errorf("docker: list the owner's unused snapshot images: %w", err)
	}
	var errs []error
	for _, img := range strings.Fields(out) {
		if _, err := b.cli.Output(ctx, "rmi", img); err != nil && !cliexec.Matches([]byte(err.Error()), "conflict", "No such image") {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("docker: remove the owner's unused snapshot images: %w", err)
	}
	return nil
}
