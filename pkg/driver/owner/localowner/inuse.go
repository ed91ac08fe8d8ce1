package localowner

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// A snapshot that a sandbox made from it still uses cannot be removed on
// every backend: OpenSandbox's Docker runtime refuses it (409
// SNAPSHOT::DELETE_CONFLICT, sandbox.ErrSnapshotInUse) until the fork is
// gone. When the owner drops such a snapshot (its retention, or a retired
// checkpoint), that is no failure: the snapshot is kept and removed later,
// once the sandbox made from it is removed. The owner's lender is wrapped
// for that (New), so every caller of RemoveSnapshot gets it.

// inUseRetry is how often, at most, the snapshots kept this way whose
// fork this owner did not make are tried again (at a removal of a
// snapshot); one whose fork it made is tried again as soon as that fork is
// removed.
const inUseRetry = time.Minute

// keepInUse is a lender whose RemoveSnapshot keeps a snapshot still in use
// and removes it once it is not.
type keepInUse struct {
	Sandboxes
	log *slog.Logger

	mu        sync.Mutex
	madeFrom  map[string]string // sandbox id -> the snapshot it was forked from
	kept      map[string]bool   // snapshots refused as in use, to remove later
	lastRetry time.Time
}

// keepInUseOf wraps s (keeping it a Renewer if it is one).
func keepInUseOf(s Sandboxes, log *slog.Logger) Sandboxes {
	k := &keepInUse{Sandboxes: s, log: log, madeFrom: map[string]string{}, kept: map[string]bool{}}
	if r, ok := s.(Renewer); ok {
		return &keepInUseRenewer{keepInUse: k, r: r}
	}
	return k
}

// Unwrap returns the wrapped lender.
func (k *keepInUse) Unwrap() Sandboxes { return k.Sandboxes }

type keepInUseRenewer struct {
	*keepInUse
	r Renewer
}

// Renew renews through the wrapped lender.
func (k *keepInUseRenewer) Renew(ctx context.Context, id string, ttl time.Duration) error {
	return k.r.Renew(ctx, id, ttl)
}

// Fork forks and remembers which snapshot the fork uses.
func (k *keepInUse) Fork(ctx context.Context, snapshotID, name string) (sandbox.Sandbox, error) {
	sb, err := k.Sandboxes.Fork(ctx, snapshotID, name)
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
	if err := k.Sandboxes.Remove(ctx, id); err != nil {
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
	err := k.Sandboxes.RemoveSnapshot(ctx, id)
	k.mu.Lock()
	switch {
	case errors.Is(err, sandbox.ErrSnapshotInUse):
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
	err := k.Sandboxes.RemoveSnapshot(ctx, snap)
	if errors.Is(err, sandbox.ErrSnapshotInUse) {
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

// KeptInUse lists the snapshots the owner dropped that are kept because a
// sandbox made from them still uses them (removed once it is gone).
func (o *Owner) KeptInUse() []string {
	var k *keepInUse
	switch s := o.opt.Sandboxes.(type) {
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
