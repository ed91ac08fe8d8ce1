package opensandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// MetadataName is the metadata key holding the name an owner gave a
// sandbox (the lifecycle server picks the id).
const MetadataName = "name"

// The lending side: what an owner built on this backend calls (it
// implements sandbox.Lender).

// Create makes a sandbox from Options.Image, named name in its metadata,
// waits until it runs and its execd answers (the server reports Running
// before execd listens), and makes its root and workdir folders. The id
// is the server's. On failure the sandbox is deleted.
func (b *Backend) Create(ctx context.Context, name string) (sandbox.Sandbox, error) {
	if b.opt.Image == "" {
		return nil, errors.New("opensandbox: no image configured for new sandboxes")
	}
	return b.create(ctx, name, CreateRequest{Image: &ImageSpec{URI: b.opt.Image}})
}

// Fork makes a sandbox from a snapshot (the same files at the same paths),
// named name in its metadata, and waits until it runs and its execd
// answers.
func (b *Backend) Fork(ctx context.Context, snapshotID, name string) (sandbox.Sandbox, error) {
	if snapshotID == "" {
		return nil, errors.New("opensandbox: fork: empty snapshot id")
	}
	return b.create(ctx, name, CreateRequest{SnapshotID: snapshotID})
}

func (b *Backend) create(ctx context.Context, name string, req CreateRequest) (sandbox.Sandbox, error) {
	req.Timeout = int(b.opt.TTL / time.Second)
	req.ResourceLimits = b.opt.ResourceLimits
	req.Entrypoint = b.opt.Entrypoint
	req.Env = b.opt.Env
	req.Metadata = maps.Clone(b.opt.Metadata)
	if req.Metadata == nil {
		req.Metadata = map[string]string{}
	}
	if name != "" {
		req.Metadata[MetadataName] = name
	}
	info, err := b.lc.Create(ctx, req)
	if err != nil {
		return nil, err
	}
	undo := func(cause error) error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := b.lc.Delete(dctx, info.ID); derr != nil && !errors.Is(derr, sandbox.ErrGone) {
			return fmt.Errorf("%w (and deleting it failed: %v)", cause, derr)
		}
		return cause
	}
	if _, err := b.lc.WaitRunning(ctx, info.ID); err != nil {
		return nil, undo(fmt.Errorf("opensandbox: sandbox %s (%s): %w", info.ID, name, err))
	}
	s := b.open(info.ID, "")
	if err := s.ready(ctx); err != nil {
		return nil, undo(fmt.Errorf("opensandbox: sandbox %s (%s): %w", info.ID, name, err))
	}
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"mkdir", "-p", "--", b.opt.Root, b.opt.Workdir}, Dir: "/", Timeout: time.Minute})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("mkdir exited %d: %s", res.ExitCode, res.Stderr)
	}
	if err != nil {
		return nil, undo(fmt.Errorf("opensandbox: prepare sandbox %s (%s): %w", info.ID, name, err))
	}
	return s, nil
}

// Open returns the sandbox with that id; one the server does not know, or
// whose state is gone for good (GoneState), is sandbox.ErrGone.
func (b *Backend) Open(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if _, err := b.lc.Alive(ctx, id); err != nil {
		return nil, err
	}
	return b.open(id, ""), nil
}

// Snapshot snapshots the sandbox's files and waits until the snapshot is
// ready; it returns the snapshot's id. name is the snapshot's name on the
// server (a second snapshot of a name is a new snapshot: the first stays).
// The sandbox is frozen while the server takes it (the Docker runtime
// commits the container paused): execs sent meanwhile wait. A sandbox that
// is gone (a 404, or a state gone for good, whatever the server answered
// the snapshot with) is sandbox.ErrGone.
func (b *Backend) Snapshot(ctx context.Context, sandboxID, name string) (string, error) {
	gone := func(err error) error {
		if errors.Is(err, sandbox.ErrGone) {
			return err
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		if _, aerr := b.lc.Alive(actx, sandboxID); errors.Is(aerr, sandbox.ErrGone) {
			return fmt.Errorf("%w (%v)", aerr, err)
		}
		return err
	}
	info, err := b.lc.CreateSnapshot(ctx, sandboxID, name)
	if err != nil {
		return "", gone(err)
	}
	if _, err := b.lc.WaitSnapshot(ctx, info.ID); err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		_ = b.lc.DeleteSnapshot(dctx, info.ID)
		cancel()
		return "", gone(err)
	}
	return info.ID, nil
}

// Remove deletes a sandbox (its processes end with it). Removing one that
// does not exist is not an error.
func (b *Backend) Remove(ctx context.Context, id string) error {
	b.forgetAll(id)
	if err := b.lc.Delete(ctx, id); err != nil && !errors.Is(err, sandbox.ErrGone) {
		return err
	}
	return nil
}

// RemoveSnapshot deletes a snapshot. Removing one that does not exist is
// not an error; one that a sandbox made from it still uses is
// sandbox.ErrSnapshotInUse (the server keeps it until that sandbox is
// gone; remove it again then).
func (b *Backend) RemoveSnapshot(ctx context.Context, id string) error {
	if err := b.lc.DeleteSnapshot(ctx, id); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		return err
	}
	return nil
}

// Renew moves the sandbox's expiration to ttl from now (Options.TTL when
// ttl is 0).
func (b *Backend) Renew(ctx context.Context, id string, ttl time.Duration) error {
	if ttl <= 0 {
		ttl = b.opt.TTL
	}
	_, err := b.lc.Renew(ctx, id, time.Now().Add(ttl))
	return err
}

// TTL is the lifetime of new sandboxes, the one Renew renews by default.
func (b *Backend) TTL() time.Duration { return b.opt.TTL }
