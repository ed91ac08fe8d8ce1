package gym

import (
	"context"
	"time"
)

// leaseWatch is the timer that resumes a checkpoint whose lease passed.
type leaseWatch struct {
	checkpointID string
	timer        *time.Timer
}

// Renew extends the lease of the open checkpoint.
func (c *Control) Renew(ctx context.Context, req Request) (*RenewReply, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.admitLocked(req.CheckpointID, OpRenew); err != nil {
		return nil, err
	}
	c.renewLocked(req)
	return &RenewReply{LeaseExpiresAt: c.leaseEnd}, nil
}

// renewLocked moves the lease to max(current, deadline_ts + grace) and
// starts its watch if none runs.
func (c *Control) renewLocked(req Request) {
	c.leaseEnd = max(c.leaseEnd, req.DeadlineTS+c.grace)
	if c.lease == nil {
		w := &leaseWatch{checkpointID: req.CheckpointID}
		c.lease = w
		w.timer = time.AfterFunc(seconds(c.leaseEnd-nowSeconds()), func() { c.leaseFired(w) })
	}
}

// leaseFired resumes the checkpoint on its own when its lease has passed
// with nobody calling, the same as an abort; if the lease was renewed
// meanwhile it waits again.
func (c *Control) leaseFired(w *leaseWatch) {
	c.lock(context.Background())
	defer c.unlock()
	c.mu.Lock()
	if c.lease != w {
		c.mu.Unlock()
		return
	}
	if remaining := c.leaseEnd - nowSeconds(); remaining > 0 {
		w.timer = time.AfterFunc(seconds(remaining), func() { c.leaseFired(w) })
		c.mu.Unlock()
		return
	}
	phase := c.phase
	c.mu.Unlock()
	c.logf("checkpoint %s lease expired in phase %s; resuming %s", w.checkpointID, phase, c.instance)
	if err := c.reopen(context.Background(), w.checkpointID); err != nil {
		c.logf("checkpoint %s: resuming after the lease expired failed: %v", w.checkpointID, err)
	}
}
