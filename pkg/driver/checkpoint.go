package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/gym"
)

// CheckpointDeadline is how long each call of an in-process checkpoint may
// take (its deadline_ts).
const CheckpointDeadline = 5 * time.Minute

// Committed is one committed checkpoint: its id, the folder it was written
// to, and the episodes the first participant (the agent) committed.
type Committed struct {
	ID       string
	Dir      string
	Episodes []gym.EpisodeID
}

func request(id string) gym.Request {
	return gym.Request{CheckpointID: id, DeadlineTS: float64(time.Now().Add(CheckpointDeadline).UnixNano()) / 1e9}
}

// Checkpoint runs one whole checkpoint in process the way Gym's coordinator
// drives its participants: prepare each in order (the agent before the
// resources server, Gym's PREPARE_ORDER), commit each into dir, then
// resume each after hold. It is how `ngdriver run --checkpoint-at` and the
// tests take a checkpoint without HTTP. A failure resumes every
// participant (the checkpoint is abandoned). If ctx ends during the hold,
// the checkpoint is returned committed but not opened, with an error.
func Checkpoint(ctx context.Context, parts []*gym.Control, dir, id string, hold time.Duration, log *slog.Logger) (Committed, error) {
	log = log.With("checkpoint", id)
	abandon := func(err error) (Committed, error) {
		for _, c := range parts {
			if _, rerr := c.Resume(context.WithoutCancel(ctx), request(id)); rerr != nil {
				err = errors.Join(err, fmt.Errorf("resume %s after the failure: %w", c.Status().Kind, rerr))
			}
		}
		return Committed{}, err
	}
	begin := time.Now()
	for _, c := range parts {
		rep, err := c.Prepare(ctx, request(id))
		if err != nil {
			return abandon(fmt.Errorf("prepare checkpoint %s (%s): %w", id, c.Status().Kind, err))
		}
		if rep.Phase != gym.PhasePrepared {
			return abandon(fmt.Errorf("prepare checkpoint %s (%s): not ready by the deadline, blocked by %s", id, c.Status().Kind, strings.Join(rep.Report.Blockers, ", ")))
		}
	}
	log.Info("checkpoint prepared", "elapsed_ms", time.Since(begin).Milliseconds())
	out := Committed{ID: id, Dir: dir}
	for i, c := range parts {
		rep, err := c.Commit(ctx, &gym.CommitRequest{Request: request(id), CheckpointDir: dir})
		if err != nil {
			return abandon(fmt.Errorf("commit checkpoint %s (%s): %w", id, c.Status().Kind, err))
		}
		if i == 0 {
			for _, k := range rep.EpisodeIDs {
				if e, err := gym.ParseCaptureKey(k); err == nil {
					out.Episodes = append(out.Episodes, e)
				}
			}
		}
		log.Info("checkpoint committed", "participant", c.Status().Kind, "records", rep.Manifest.RecordCount)
	}
	if hold > 0 {
		select {
		case <-time.After(hold):
		case <-ctx.Done():
			// The caller is going away (a rehearsed crash): the
			// checkpoint stays committed and is not opened.
			return out, fmt.Errorf("checkpoint %s committed, not opened: %w", id, context.Cause(ctx))
		}
	}
	for _, c := range parts {
		if _, err := c.Resume(context.WithoutCancel(ctx), request(id)); err != nil {
			return out, fmt.Errorf("resume checkpoint %s (%s): %w", id, c.Status().Kind, err)
		}
	}
	log.Info("checkpoint opened")
	return out, nil
}

// Restore restores a committed checkpoint into fresh participants, as the
// coordinator does after a crash: each installs the records of c.Episodes
// under their next attempt, then resumes (admission reopens; the
// replacement runs claim their records).
func Restore(ctx context.Context, parts []*gym.Control, c Committed) error {
	id := "restore-" + c.ID
	for _, p := range parts {
		if _, err := p.Restore(ctx, &gym.RestoreRequest{Request: request(id), CheckpointDir: c.Dir, EpisodeIDs: slices.Clone(c.Episodes)}); err != nil {
			return fmt.Errorf("restore checkpoint %s (%s): %w", c.ID, p.Status().Kind, err)
		}
	}
	for _, p := range parts {
		if _, err := p.Resume(ctx, request(id)); err != nil {
			return fmt.Errorf("resume after restoring %s (%s): %w", c.ID, p.Status().Kind, err)
		}
	}
	return nil
}
