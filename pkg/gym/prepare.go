package gym

import (
	"context"
	"time"
)

// Prepare closes admission for the checkpoint and waits, up to the
// deadline, for the participant to be ready. Ready: phase prepared, and
// the reply is replayed for the same id. Deadline passed first: phase
// stays preparing, the blockers are listed and admission stays closed.
func (c *Control) Prepare(ctx context.Context, req Request) (*PrepareReply, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	if r, ok := c.replay(req.CheckpointID, OpPrepare); ok {
		c.unlock()
		return r.(*PrepareReply), nil
	}
	c.mu.Lock()
	if err := c.admitLocked(req.CheckpointID, OpPrepare); err != nil {
		c.mu.Unlock()
		c.unlock()
		return nil, err
	}
	starting := c.phase == PhaseIdle
	if starting {
		c.checkpointID, c.phase = req.CheckpointID, PhasePreparing
	}
	c.renewLocked(req)
	c.mu.Unlock()
	if starting {
		if err := c.p.CloseAdmission(context.WithoutCancel(ctx), req); err != nil {
			// Phase and admission never disagree: a failed close reopens.
			c.reopen(ctx, "")
			c.unlock()
			return nil, err
		}
	}
	c.unlock()

	waitErr := c.waitReady(ctx, req)

	if err := c.lock(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	defer c.unlock()
	c.mu.Lock()
	current := c.checkpointID == req.CheckpointID && c.phase == PhasePreparing
	c.mu.Unlock()
	if waitErr != nil {
		if current {
			c.reopen(ctx, "")
		}
		return nil, waitErr
	}
	if !current {
		// A resume, a lease expiry or another prepare ended the wait.
		return &PrepareReply{Phase: c.currentPhase(), Report: c.p.Readiness()}, nil
	}
	report := c.p.Readiness()
	if !report.Ready {
		return &PrepareReply{Phase: PhasePreparing, Report: report}, nil
	}
	c.mu.Lock()
	c.phase = PhasePrepared
	reply := &PrepareReply{Phase: PhasePrepared, Report: report}
	c.results[resultKey{req.CheckpointID, OpPrepare}] = reply
	c.mu.Unlock()
	return reply, nil
}

// waitReady returns once the participant is ready, the deadline passed,
// or the checkpoint is no longer this one. It asks only whether it is
// ready; the blockers are listed once, for the reply.
func (c *Control) waitReady(ctx context.Context, req Request) error {
	for {
		c.mu.Lock()
		changed, current := c.changed, c.checkpointID == req.CheckpointID
		c.mu.Unlock()
		remaining := req.DeadlineTS - nowSeconds()
		if !current || remaining <= 0 || c.ready() {
			return nil
		}
		wait := time.NewTimer(min(seconds(remaining), time.Second))
		select {
		case <-changed:
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return ctx.Err()
		}
		wait.Stop()
	}
}

func (c *Control) ready() bool {
	if r, ok := c.p.(Readier); ok {
		return r.Ready()
	}
	return c.p.Readiness().Ready
}

// Resume ends the checkpoint whether or not it was published: a write
// under way is stopped before it publishes, admission reopens, and the id
// is remembered so a stale controller cannot reopen it. For an id resumed
// before, or when nothing is open (the id is then fenced), it answers
// idempotent.
func (c *Control) Resume(ctx context.Context, req Request) (*ResumeReply, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	c.mu.Lock()
	if c.resumedSet[req.CheckpointID] {
		c.mu.Unlock()
		return &ResumeReply{Phase: PhaseIdle, Idempotent: true}, nil
	}
	if c.phase == PhaseIdle && c.checkpointID == "" {
		// A prepare that stopped at an earlier participant never reached
		// this one: fence the id so a delayed prepare cannot close admission.
		c.rememberLocked(req.CheckpointID)
		c.mu.Unlock()
		return &ResumeReply{Phase: PhaseIdle, Idempotent: true}, nil
	}
	err := c.admitLocked(req.CheckpointID, OpResume)
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := c.reopen(ctx, req.CheckpointID); err != nil {
		return nil, err
	}
	return &ResumeReply{Phase: PhaseIdle, Idempotent: false}, nil
}
