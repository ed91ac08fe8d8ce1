package lending

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// RenewOpen renews, by ttl from now, the sandbox of every open session
// when the backend's sandboxes expire (its lender is a sandbox.Renewer); otherwise
// it does nothing. The error names the sessions whose renewal failed.
func (o *Owner) RenewOpen(ctx context.Context, ttl time.Duration) error {
	r, ok := o.opt.Sandboxes.(sandbox.Renewer)
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
		return fmt.Errorf("owner: renew: %w", err)
	}
	return nil
}

// KeepAlive calls RenewOpen(ttl) every interval until ctx ends, logging
// failures. It returns at once when the backend's sandboxes do not expire.
func (o *Owner) KeepAlive(ctx context.Context, every, ttl time.Duration) {
	if _, ok := o.opt.Sandboxes.(sandbox.Renewer); !ok || every <= 0 {
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
			return n, fmt.Errorf("owner: %w", err)
		}
		return n, nil
	}
	if o.opt.KillSandbox == nil && o.opt.StopSandbox == nil {
		return 0, nil
	}
	ids, err := lb.List()
	if err != nil {
		return 0, fmt.Errorf("owner: %w", err)
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
		return n, fmt.Errorf("owner: end what runs in sandboxes no session uses: %w", err)
	}
	return n, nil
}

// KeptInUse lists the snapshots the owner dropped that are kept because a
// sandbox made from them still uses them (removed once it is gone:
// sandbox.KeepSnapshotsInUse).
func (o *Owner) KeptInUse() []string { return sandbox.SnapshotsKeptInUse(o.opt.Sandboxes) }
