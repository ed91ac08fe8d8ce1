package driver

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// CheckpointOwner is the sandbox owner's side of a checkpoint: it snapshots
// the sandboxes of open sessions at commit, and at restore forks each
// snapshot under a new sandbox id that /sandbox_access names from then on.
type CheckpointOwner interface {
	Snapshot(ctx context.Context, checkpointID string) (map[string]string, error)
	Restore(ctx context.Context, checkpointID string) error
	Retire(ctx context.Context, checkpointID string) error
}

// Committed is one committed checkpoint: its id and the runs it exported.
type Committed struct {
	ID      string
	Records []Record
}

// Checkpoint runs one whole checkpoint in process, as a controller would:
// prepare (every run parks), the owner's snapshot, commit, then resume after
// hold. It is how `ngdriver run --checkpoint-at` and the tests open a
// checkpoint without the HTTP control plane. If ctx ends during the hold,
// the checkpoint is returned committed but not opened, with an error.
func Checkpoint(ctx context.Context, p *Participant, o CheckpointOwner, id string, hold time.Duration, log *slog.Logger) (Committed, error) {
	log = log.With("checkpoint", id)
	prep, err := p.Prepare(ctx, id, time.Now().Add(5*time.Minute))
	if err != nil {
		return Committed{}, fmt.Errorf("prepare checkpoint %s: %w", id, err)
	}
	if !prep.Parked {
		p.Resume(id)
		return Committed{}, fmt.Errorf("prepare checkpoint %s: runs not parked by the deadline: %v", id, prep.NotParked)
	}
	log.Info("checkpoint prepared", "runs", len(prep.Records), "elapsed_ms", prep.ElapsedMS)
	snaps, err := o.Snapshot(ctx, id)
	if err != nil {
		p.Resume(id)
		return Committed{}, fmt.Errorf("snapshot for checkpoint %s: %w", id, err)
	}
	recs, err := p.Commit(ctx, id, false)
	if err != nil {
		p.Resume(id)
		return Committed{}, err
	}
	log.Info("checkpoint committed", "snapshots", len(snaps), "records", len(recs))
	if hold > 0 {
		select {
		case <-time.After(hold):
		case <-ctx.Done():
			// The caller is going away (a rehearsed crash): the
			// checkpoint stays committed and is not opened.
			return Committed{ID: id, Records: recs}, fmt.Errorf("checkpoint %s committed, not opened: %w", id, context.Cause(ctx))
		}
	}
	if err := p.Resume(id); err != nil {
		return Committed{}, err
	}
	log.Info("checkpoint opened")
	return Committed{ID: id, Records: recs}, nil
}
