package gym

import (
	"context"
	"slices"
)

// CheckAttempt refuses, with ErrStaleAttempt, an attempt that was retired
// (or an earlier one of its rollout) and not yet forgotten. A participant
// calls it on its data plane before admitting an attempt's work.
func (c *Control) CheckAttempt(id EpisodeID) error {
	c.mu.Lock()
	mark, ok := c.retired[id.RolloutID]
	c.mu.Unlock()
	if ok && id.Attempt <= mark {
		return Refuse(ErrStaleAttempt, "rollout %q attempt %d was retired", id.RolloutID, id.Attempt)
	}
	return nil
}

// Retire marks the attempts (and every earlier one of their rollouts) as
// refused until Forget, then stops their work and frees their state, and
// replies only after that. Allowed when idle and after a restore; while a
// checkpoint is open it is refused (stopping work waits for cleanup that
// waits for resume). The marks stay even if stopping fails.
func (c *Control) Retire(ctx context.Context, req *RetireRequest) (*RetireReply, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	err := c.admitOutsideCheckpoint(req.Request, OpRetire)
	if err == nil {
		err = c.within(ctx, req.Request, func(context.Context) error {
			c.mu.Lock()
			for _, id := range req.EpisodeIDs {
				if mark, ok := c.retired[id.RolloutID]; !ok || id.Attempt > mark {
					c.retired[id.RolloutID] = id.Attempt
				}
			}
			c.mu.Unlock()
			return nil
		})
	}
	if err == nil {
		err = c.within(ctx, req.Request, func(ctx context.Context) error {
			if err := c.installed(ctx); err != nil {
				return err
			}
			for _, id := range req.EpisodeIDs {
				if err := c.p.Retire(ctx, id); err != nil {
					return err
				}
			}
			return nil
		})
	}
	c.unlock()
	if err != nil {
		return nil, err
	}
	c.Notify()
	keys := make([]string, len(req.EpisodeIDs))
	for i, id := range req.EpisodeIDs {
		keys[i] = id.CaptureKey()
	}
	return &RetireReply{Retired: keys}, nil
}

// Forget lifts the retire marks of rollouts that are finished for good.
func (c *Control) Forget(ctx context.Context, req *ForgetRequest) (*ForgetReply, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	if err := c.admitOutsideCheckpoint(req.Request, OpForget); err != nil {
		return nil, err
	}
	err := c.within(ctx, req.Request, func(context.Context) error {
		c.mu.Lock()
		for _, id := range req.RolloutIDs {
			delete(c.retired, id)
		}
		c.mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	ids := slices.Clone(req.RolloutIDs)
	slices.Sort(ids)
	return &ForgetReply{Forgotten: ids}, nil
}

// admitOutsideCheckpoint is the fence of retire and forget: their own
// checkpoint id is only checked against an active restore's, and a
// resumed id is no obstacle.
func (c *Control) admitOutsideCheckpoint(req Request, op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !routeOf[op].allows(c.phase) {
		return Refuse(ErrInvalidPhase, "not valid in phase %s; resume first", c.phase)
	}
	if c.checkpointID != "" && c.checkpointID != req.CheckpointID {
		return Refuse(ErrCheckpointConflict, "checkpoint %q is active", c.checkpointID)
	}
	if c.phase != PhaseIdle {
		c.renewLocked(req)
	}
	return nil
}
