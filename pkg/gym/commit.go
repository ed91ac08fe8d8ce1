package gym

import (
	"context"
	"slices"
)

// pendingWrite is a checkpoint's one export and the run storing it. A
// retried commit never exports again: it waits for the run, or stores the
// same records again if storing failed.
type pendingWrite struct {
	checkpointID string
	dir          string
	scope        []EpisodeID
	records      []Record
	stop         *WriteStop
	run          *run
}

// Commit exports the prepared state within the scope and writes it,
// manifest last, under req.CheckpointDir. Readiness is checked again (it
// can regress after prepare), a scope naming a restart is refused with
// ErrRestartInScope, restored state the scope leaves out is deleted, and
// with Stop the exported state is parked once durable. A write that
// outlives the deadline fails this call and goes on; a retry waits for the
// same write. The reply is replayed for the same id.
func (c *Control) Commit(ctx context.Context, req *CommitRequest) (*CommitReply, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	if r, ok := c.replay(req.CheckpointID, OpCommit); ok {
		return r.(*CommitReply), nil
	}
	c.mu.Lock()
	err := c.admitLocked(req.CheckpointID, OpCommit)
	if err == nil {
		c.renewLocked(req.Request)
	}
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	report := c.p.Readiness()
	if !report.Ready {
		return nil, Refuse(ErrInvalidPhase, "participant is no longer ready to commit: blockers=%v", report.Blockers)
	}
	if req.EpisodeIDs != nil {
		// Fail closed: this participant holds none of a restart's state.
		var restarted []string
		for _, id := range req.EpisodeIDs {
			if slices.Contains(report.Restarts, id.CaptureKey()) && !slices.Contains(restarted, id.CaptureKey()) {
				restarted = append(restarted, id.CaptureKey())
			}
		}
		if len(restarted) > 0 {
			slices.Sort(restarted)
			return nil, Refuse(ErrRestartInScope, "the commit scope names episodes that restart: %v", restarted)
		}
	}
	w, err := c.startWrite(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := c.await(ctx, req.Request, w.run.done); err != nil {
		return nil, err
	}
	if w.run.err != nil {
		return nil, w.run.err
	}
	if err := c.within(ctx, req.Request, func(ctx context.Context) error { return c.deleteUnscoped(ctx, req.EpisodeIDs) }); err != nil {
		return nil, err
	}
	if req.Stop {
		// The checkpoint is durable; what a stopped process leaves running is a cost, not a loss.
		if err := c.within(ctx, req.Request, func(ctx context.Context) error { return c.p.ParkExported(ctx, w.records) }); err != nil {
			c.logf("checkpoint %s: parking the exported state for the stop failed: %v", req.CheckpointID, err)
		}
	}
	keys := make([]string, 0, len(w.records))
	for _, r := range w.records {
		keys = append(keys, r.EpisodeID.CaptureKey())
	}
	slices.Sort(keys)
	reply := &CommitReply{Phase: PhaseCommitted, Manifest: w.run.manifest, EpisodeIDs: slices.Compact(keys)}
	if x, ok := c.p.(CommitReplier); ok {
		reply.Extra = x.CommitReply(w.records)
	}
	c.mu.Lock()
	c.phase = PhaseCommitted
	c.results[resultKey{req.CheckpointID, OpCommit}] = reply
	c.mu.Unlock()
	return reply, nil
}

// startWrite returns the checkpoint's write: the one under way or done,
// or the same records stored again if storing failed.
func (c *Control) startWrite(ctx context.Context, req *CommitRequest) (*pendingWrite, error) {
	c.mu.Lock()
	w := c.write
	c.mu.Unlock()
	if w == nil || w.checkpointID != req.CheckpointID {
		var records []Record
		err := c.within(ctx, req.Request, func(ctx context.Context) (err error) {
			records, err = c.p.Export(ctx, req.EpisodeIDs)
			return err
		})
		if err != nil {
			// A disk that fails under the exported state (the owner's
			// snapshots) answers as one under the records does.
			return nil, StorageRefusal(err, "cannot export the state of checkpoint %q", req.CheckpointID)
		}
		w = &pendingWrite{checkpointID: req.CheckpointID, dir: req.CheckpointDir, scope: slices.Clone(req.EpisodeIDs), records: records, stop: &WriteStop{}}
		c.mu.Lock()
		c.write = w
		c.mu.Unlock()
	} else if w.dir != req.CheckpointDir || !sameScope(w.scope, req.EpisodeIDs) {
		return nil, Refuse(ErrCheckpointConflict, "checkpoint %q is already being written to another directory or scope", req.CheckpointID)
	}
	if w.run == nil || (w.run.finished() && w.run.err != nil) {
		if x, ok := c.p.(WriteWatcher); ok {
			if pdir, err := ParticipantDir(w.dir, c.p.Kind(), c.instance); err == nil {
				x.Writing(w.checkpointID, pdir)
			}
		}
		var extra map[string]any
		if x, ok := c.p.(ManifestExtender); ok {
			extra = x.ManifestExtra()
		}
		r := &run{done: make(chan struct{})}
		w.run = r
		go func() {
			defer close(r.done)
			r.manifest, r.err = WriteState(w.dir, c.p.Kind(), c.instance, w.checkpointID, w.records, extra, w.stop)
		}()
	}
	return w, nil
}

// sameScope compares two scopes as Gym compares them: nil (everything)
// differs from empty (nothing), and order counts.
func sameScope(a, b []EpisodeID) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}

// deleteUnscoped deletes restored state the commit's scope leaves out.
func (c *Control) deleteUnscoped(ctx context.Context, scope []EpisodeID) error {
	keeper, ok := c.p.(RestoredKeeper)
	if scope == nil || !ok {
		return nil
	}
	pending, err := keeper.RestoredPending(ctx)
	if err != nil {
		return err
	}
	for _, id := range pending {
		if !slices.Contains(scope, id) {
			if err := keeper.DeleteRestored(ctx, id); err != nil {
				return err
			}
		}
	}
	return nil
}
