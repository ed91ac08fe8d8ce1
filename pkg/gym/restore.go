package gym

import (
	"context"
	"slices"
)

// Restore reads the participant's records of the checkpoint in
// req.CheckpointDir in one verified pass, keeps those in scope, closes
// admission and installs them under attempt + 1 (phase restored; a resume
// then reopens admission). Only when idle. An install that outlives the
// deadline goes on; admission reopens once it has finished. The reply is
// replayed for the same id.
func (c *Control) Restore(ctx context.Context, req *RestoreRequest) (*RestoreReply, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	if r, ok := c.replay(req.CheckpointID, OpRestore); ok {
		return r.(*RestoreReply), nil
	}
	c.mu.Lock()
	err := c.admitLocked(req.CheckpointID, OpRestore)
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	scope := map[string]bool{}
	for _, id := range req.EpisodeIDs {
		scope[id.CaptureKey()] = true
	}
	read := &run{done: make(chan struct{})}
	var records []Record
	go func() {
		defer close(read.done)
		read.manifest, read.err = ReadState(req.CheckpointDir, c.p.Kind(), c.instance, func(r Record) error {
			if scope[r.EpisodeID.CaptureKey()] {
				records = append(records, r)
			}
			return nil
		})
	}()
	if err := c.await(ctx, req.Request, read.done); err != nil {
		return nil, err
	}
	if read.err != nil {
		return nil, read.err
	}
	if err := c.within(ctx, req.Request, c.installed); err != nil {
		return nil, err
	}
	install, err := c.closeAndInstall(ctx, req, read.manifest, records)
	if err != nil {
		if install != nil && !install.finished() {
			go c.openAfterInstall(install)
		} else if oerr := c.p.OpenAdmission(context.WithoutCancel(ctx)); oerr != nil {
			c.logf("reopening admission after a failed restore failed: %v", oerr)
		}
		return nil, err
	}
	restored := make([]string, len(records))
	for i, r := range records {
		restored[i] = r.EpisodeID.Next().CaptureKey()
	}
	slices.Sort(restored)
	reply := &RestoreReply{Phase: PhaseRestored, SourceCheckpointID: read.manifest.CheckpointID, Restored: restored}
	c.mu.Lock()
	c.checkpointID, c.phase = req.CheckpointID, PhaseRestored
	c.renewLocked(req.Request)
	c.results[resultKey{req.CheckpointID, OpRestore}] = reply
	c.mu.Unlock()
	return reply, nil
}

// closeAndInstall closes admission and runs the install in its own
// goroutine, waiting for it up to the deadline; it returns the install
// run once one started.
func (c *Control) closeAndInstall(ctx context.Context, req *RestoreRequest, m Manifest, records []Record) (*run, error) {
	if err := c.p.CloseAdmission(context.WithoutCancel(ctx), req.Request); err != nil {
		return nil, err
	}
	if x, ok := c.p.(ManifestExtender); ok {
		if err := x.RestoreManifest(m); err != nil {
			return nil, err
		}
	}
	install := &run{done: make(chan struct{})}
	c.mu.Lock()
	c.install = install
	c.mu.Unlock()
	ictx := context.WithoutCancel(ctx)
	go func() {
		defer close(install.done)
		install.err = c.p.Install(ictx, records, req.EpisodeIDs)
	}()
	if err := c.await(ctx, req.Request, install.done); err != nil {
		return install, err
	}
	return install, install.err
}

// openAfterInstall reopens admission once an install that outlived its
// failed restore has finished, unless a later restore owns admission now.
func (c *Control) openAfterInstall(install *run) {
	<-install.done
	c.lock(context.Background())
	defer c.unlock()
	c.mu.Lock()
	mine := c.phase == PhaseIdle && c.checkpointID == "" && c.install == install
	c.mu.Unlock()
	if mine {
		if err := c.p.OpenAdmission(context.Background()); err != nil {
			c.logf("reopening admission after a failed restore failed: %v", err)
		}
	}
}

// installed waits for an install still running after its restore's
// deadline (its outcome was already reported).
func (c *Control) installed(ctx context.Context) error {
	c.mu.Lock()
	install := c.install
	c.mu.Unlock()
	if install == nil {
		return nil
	}
	select {
	case <-install.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
