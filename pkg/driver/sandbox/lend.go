package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// Lender is what a backend provides so that an owner can lend its
// sandboxes: make one, find one, snapshot one, fork a snapshot, and remove
// them. The backends implement it (local through local.Backend.Lender,
// OpenSandbox, docker and kubectl directly), so one owner
// (pkg/driver/owner/lending) lends sandboxes of any of them, and the
// conformance suite checks every one the same way.
//
// Names are the owner's (sb-<session>-<n>); a backend may give the sandbox
// or snapshot an id of its own, which the owner then uses. A fork must
// look the same from inside as the sandbox snapshotted: the same files at
// the same paths.
type Lender interface {
	// Name is the provider name descriptors use.
	Name() string
	// Create makes a new sandbox called name, with its Root and Workdir
	// folders.
	Create(ctx context.Context, name string) (Sandbox, error)
	// Open returns the sandbox with that id; one that does not exist is
	// ErrGone.
	Open(ctx context.Context, id string) (Sandbox, error)
	// Snapshot copies the sandbox's files (the caller holds it still) into
	// a snapshot called name, replacing any snapshot of that name, and
	// returns the snapshot's id.
	Snapshot(ctx context.Context, sandboxID, name string) (string, error)
	// Fork makes a new sandbox called name from a snapshot.
	Fork(ctx context.Context, snapshotID, name string) (Sandbox, error)
	// Remove deletes a sandbox; removing one that does not exist is not an
	// error.
	Remove(ctx context.Context, id string) error
	// RemoveSnapshot deletes a snapshot; removing one that does not exist
	// is not an error. One that a sandbox forked from it still uses may be
	// refused with ErrSnapshotInUse: it stays (KeepSnapshotsInUse removes
	// it once that sandbox is gone).
	RemoveSnapshot(ctx context.Context, id string) error
}

// Renewer is implemented by lenders whose sandboxes expire unless renewed
// (OpenSandbox): an owner renews the sandboxes of its open sessions.
type Renewer interface {
	Renew(ctx context.Context, id string, ttl time.Duration) error
}

// A snapshot that a sandbox made from it still uses cannot be removed on
// every backend: OpenSandbox's Docker runtime refuses it (409
// SNAPSHOT::DELETE_CONFLICT, ErrSnapshotInUse) until the fork is gone.
// When an owner drops such a snapshot (its retention, or a retired
// checkpoint), that is no failure: the snapshot is kept and removed later,
// once the sandbox made from it is removed. An owner wraps its lender
// with KeepSnapshotsInUse for that, so every caller of RemoveSnapshot gets
// it.

// inUseRetry is how often, at most, the snapshots kept this way whose
// fork the wrapper did not make are tried again (at a removal of a
// snapshot); one whose fork it made is tried again as soon as that fork is
// removed.
const inUseRetry = time.Minute

// KeepSnapshotsInUse wraps l so that its RemoveSnapshot keeps a snapshot
// a sandbox made from it still uses (l answers ErrSnapshotInUse) and
// reports no error: the snapshot is removed once that sandbox is removed
// through the wrapper (or, for a fork the wrapper did not make, tried
// again at a later RemoveSnapshot). What was kept is logged to log;
// SnapshotsKeptInUse lists it. The wrapper is a Renewer when l is one.
func KeepSnapshotsInUse(l Lender, log *slog.Logger) Lender {
	k := &keepInUse{Lender: l, log: log, madeFrom: map[string]string{}, kept: map[string]bool{}}
	if r, ok := l.(Renewer); ok {
		return &keepInUseRenewer{keepInUse: k, r: r}
	}
	return k
}

// SnapshotsKeptInUse lists, sorted, the snapshots a lender made by
// KeepSnapshotsInUse keeps because a sandbox made from them still uses
// them (removed once it is gone); nil for any other lender.
func SnapshotsKeptInUse(l Lender) []string {
	var k *keepInUse
	switch s := l.(type) {
	case *keepInUse:
		k = s
	case *keepInUseRenewer:
		k = s.keepInUse
	default:
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]string, 0, len(k.kept))
	for snap := range k.kept {
		out = append(out, snap)
	}
	sort.Strings(out)
	return out
}

// keepInUse is a lender whose RemoveSnapshot keeps a snapshot still in use
// and removes it once it is not.
type keepInUse struct {
	Lender
	log *slog.Logger

	mu        sync.Mutex
	madeFrom  map[string]string // sandbox id -> the snapshot it was forked from
	kept      map[string]bool   // snapshots refused as in use, to remove later
	lastRetry time.Time
}

type keepInUseRenewer struct {
	*keepInUse
	r Renewer
}

// Renew renews through the wrapped lender.
func (k *keepInUseRenewer) Renew(ctx context.Context, id string, ttl time.Duration) error {
	return k.r.Renew(ctx, id, ttl)
}

// Fork forks and remembers which snapshot the fork uses.
func (k *keepInUse) Fork(ctx context.Context, snapshotID, name string) (Sandbox, error) {
	sb, err := k.Lender.Fork(ctx, snapshotID, name)
	if err == nil {
		k.mu.Lock()
		k.madeFrom[sb.ID()] = snapshotID
		k.mu.Unlock()
	}
	return sb, err
}

// Remove removes a sandbox, then the snapshot it was forked from if that
// one was kept only because of it.
func (k *keepInUse) Remove(ctx context.Context, id string) error {
	if err := k.Lender.Remove(ctx, id); err != nil {
		return err
	}
	k.mu.Lock()
	snap := k.madeFrom[id]
	delete(k.madeFrom, id)
	retry := snap != "" && k.kept[snap]
	k.mu.Unlock()
	if retry {
		k.retry(ctx, snap)
	}
	return nil
}

// RemoveSnapshot removes a snapshot; one a sandbox made from it still
// uses is kept and removed later (not an error). It also tries again,
// at most every inUseRetry, the snapshots kept so whose fork is unknown
// here.
func (k *keepInUse) RemoveSnapshot(ctx context.Context, id string) error {
	err := k.Lender.RemoveSnapshot(ctx, id)
	k.mu.Lock()
	switch {
	case errors.Is(err, ErrSnapshotInUse):
		if !k.kept[id] {
			k.log.Info("a snapshot a sandbox made from it still uses is kept, and removed once that sandbox is gone", "snapshot", id, "why", err.Error())
		}
		k.kept[id] = true
		err = nil
	case err == nil:
		delete(k.kept, id)
	}
	var again []string
	if time.Since(k.lastRetry) >= inUseRetry {
		k.lastRetry = time.Now()
		used := map[string]bool{}
		for _, snap := range k.madeFrom {
			used[snap] = true
		}
		for snap := range k.kept {
			if !used[snap] && snap != id {
				again = append(again, snap)
			}
		}
	}
	k.mu.Unlock()
	sort.Strings(again)
	for _, snap := range again {
		k.retry(ctx, snap)
	}
	return err
}

// retry removes a kept snapshot if it is no longer in use.
func (k *keepInUse) retry(ctx context.Context, snap string) {
	err := k.Lender.RemoveSnapshot(ctx, snap)
	if errors.Is(err, ErrSnapshotInUse) {
		return
	}
	k.mu.Lock()
	if err == nil {
		delete(k.kept, snap)
	}
	k.mu.Unlock()
	if err != nil {
		k.log.Warn("remove a snapshot kept while a sandbox used it", "snapshot", snap, "err", err)
		return
	}
	k.log.Info("a snapshot kept while a sandbox used it is removed", "snapshot", snap)
}
