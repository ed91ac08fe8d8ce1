package localowner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// Sandboxes is what the owner needs of a backend to lend its sandboxes:
// make one, find one, snapshot one, fork a snapshot, and remove them. The
// local backend (Local), OpenSandbox, docker and kubectl implement it, so
// one owner lends sandboxes of any of them.
//
// Names are the owner's (sb-<session>-<n>); a backend may give the sandbox
// or snapshot an id of its own, which the owner then uses. A fork must
// look the same from inside as the sandbox snapshotted: the same files at
// the same paths.
type Sandboxes interface {
	// Name is the provider name descriptors use.
	Name() string
	// Create makes a new sandbox called name, with its Root and Workdir
	// folders.
	Create(ctx context.Context, name string) (sandbox.Sandbox, error)
	// Open returns the sandbox with that id; one that does not exist is
	// sandbox.ErrGone.
	Open(ctx context.Context, id string) (sandbox.Sandbox, error)
	// Snapshot copies the sandbox's files (the caller holds it still) into
	// a snapshot called name, replacing any snapshot of that name, and
	// returns the snapshot's id.
	Snapshot(ctx context.Context, sandboxID, name string) (string, error)
	// Fork makes a new sandbox called name from a snapshot.
	Fork(ctx context.Context, snapshotID, name string) (sandbox.Sandbox, error)
	// Remove deletes a sandbox; removing one that does not exist is not an
	// error.
	Remove(ctx context.Context, id string) error
	// RemoveSnapshot deletes a snapshot; removing one that does not exist
	// is not an error. One that a sandbox forked from it still uses may be
	// refused with sandbox.ErrSnapshotInUse: it stays, and the owner
	// removes it once that sandbox is gone.
	RemoveSnapshot(ctx context.Context, id string) error
}

// Renewer is implemented by backends whose sandboxes expire unless
// renewed (OpenSandbox): the owner's KeepAlive renews the sandboxes of
// open sessions.
type Renewer interface {
	Renew(ctx context.Context, id string, ttl time.Duration) error
}

// Local lends the local backend's sandboxes.
func Local(b *local.Backend) Sandboxes { return localSandboxes{b} }

type localSandboxes struct{ b *local.Backend }

func (l localSandboxes) Name() string { return l.b.Name() }

func (l localSandboxes) Create(ctx context.Context, name string) (sandbox.Sandbox, error) {
	return l.b.Create(ctx, name)
}

func (l localSandboxes) Open(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return l.b.Open(id)
}

func (l localSandboxes) Snapshot(ctx context.Context, sandboxID, name string) (string, error) {
	if l.b.HasSnapshot(name) {
		// Left by a call that failed after copying: take it again.
		if err := l.b.RemoveSnapshot(ctx, name); err != nil {
			return "", err
		}
	}
	if err := l.b.Snapshot(ctx, sandboxID, name); err != nil {
		return "", err
	}
	return name, nil
}

func (l localSandboxes) Fork(ctx context.Context, snapshotID, name string) (sandbox.Sandbox, error) {
	return l.b.Fork(ctx, snapshotID, name)
}

func (l localSandboxes) Remove(ctx context.Context, id string) error { return l.b.Remove(ctx, id) }

func (l localSandboxes) RemoveSnapshot(ctx context.Context, id string) error {
	return l.b.RemoveSnapshot(ctx, id)
}

// RenewOpen renews, by ttl from now, the sandbox of every open session
// when the backend's sandboxes expire (it implements Renewer); otherwise
// it does nothing. The error names the sessions whose renewal failed.
func (o *Owner) RenewOpen(ctx context.Context, ttl time.Duration) error {
	r, ok := o.opt.Sandboxes.(Renewer)
	if !ok {
		return nil
	}
	var errs []error
	for _, s := range o.allSessions() {
		s.mu.Lock()
		id, closed := s.sandboxID, s.closed
		s.mu.Unlock()
		if closed || id == "" {
			continue
		}
		if err := r.Renew(ctx, id, ttl); err != nil {
			errs = append(errs, fmt.Errorf("session %s: sandbox %s: %w", s.id, id, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("localowner: renew: %w", err)
	}
	return nil
}

// KeepAlive calls RenewOpen(ttl) every interval until ctx ends, logging
// failures. It returns at once when the backend's sandboxes do not expire.
func (o *Owner) KeepAlive(ctx context.Context, every, ttl time.Duration) {
	if _, ok := o.opt.Sandboxes.(Renewer); !ok || every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := o.RenewOpen(ctx, ttl); err != nil && ctx.Err() == nil {
				o.log.Warn("renew the sandboxes of open sessions", "err", err)
			}
		}
	}
}

// EndUnowned ends what still runs in the local backend's sandboxes that no
// open session of this owner uses, and returns how many processes (with
// namespace isolation) or sandboxes (without) it ended. A deployment whose
// servers died leaves its launches running or paused, each holding its
// mount namespace, some with their sandbox's folder already deleted;
// nothing else ever stops them. An owner runs it once before it serves, on
// a base it holds alone (local.Backend.Claim): then no session uses any
// sandbox yet.
//
// Identity is exact. With namespace isolation every process is found by
// the mount namespace it runs in, which binds one folder of this base's
// sandboxes (local.Backend.EndStrays): also when that folder is deleted,
// never another base's. Without it, each sandbox folder's launches are
// killed through their launch folders (Options.KillSandbox: the receipt's
// supervisor by pid and start time, the known set, the tag); a copy a fork
// carried in is left alone by ngsup. Other backends' sandboxes are not
// this host's processes: nothing is done.
func (o *Owner) EndUnowned(ctx context.Context) (int, error) {
	lb := o.local
	if lb == nil {
		return 0, nil
	}
	used := map[string]bool{}
	for _, s := range o.allSessions() {
		s.mu.Lock()
		if !s.closed && s.sandboxID != "" {
			used[s.sandboxID] = true
		}
		s.mu.Unlock()
	}
	if lb.Isolation() == local.IsolationNamespace {
		n, err := lb.EndStrays(ctx, func(id string) bool { return used[id] })
		if err != nil {
			return n, fmt.Errorf("localowner: %w", err)
		}
		return n, nil
	}
	if o.opt.KillSandbox == nil && o.opt.StopSandbox == nil {
		return 0, nil
	}
	ids, err := lb.List()
	if err != nil {
		return 0, fmt.Errorf("localowner: %w", err)
	}
	n := 0
	var errs []error
	for _, id := range ids {
		if used[id] {
			continue
		}
		if err := o.kill(ctx, id)[id]; err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", id, err))
			continue
		}
		n++
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("localowner: end what runs in sandboxes no session uses: %w", err)
	}
	return n, nil
}
