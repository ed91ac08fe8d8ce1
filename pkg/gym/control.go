package gym

import (
	"context"
	"errors"
	"log"
	"slices"
	"sync"
	"time"
)

// Phase is where a participant is in a checkpoint.
type Phase string

// The phases of Gym's participant machine.
const (
	PhaseIdle      Phase = "idle"
	PhasePreparing Phase = "preparing"
	PhasePrepared  Phase = "prepared"
	PhaseCommitted Phase = "committed"
	PhaseRestored  Phase = "restored"
)

// notIdle is every phase a checkpoint is open in.
var notIdle = []Phase{PhasePreparing, PhasePrepared, PhaseCommitted, PhaseRestored}

// allowed lists, for each operation, the phases it is accepted in. With the
// move each one makes, this is the whole machine (control.py's docstring):
//
//	prepare         idle|preparing -> preparing -> prepared (once ready)
//	commit          prepared -> committed
//	restore         idle -> restored
//	resume          preparing|prepared|committed|restored -> idle (also on lease expiry)
//	renew           any open phase, no move
//	retire, forget  idle|restored, no move
var allowed = map[string][]Phase{
	OpPrepare: {PhaseIdle, PhasePreparing},
	OpCommit:  {PhasePrepared},
	OpRestore: {PhaseIdle},
	OpResume:  notIdle,
	OpRenew:   notIdle,
	OpRetire:  {PhaseIdle, PhaseRestored},
	OpForget:  {PhaseIdle, PhaseRestored},
}

// ResumedIDsKept is how many resumed checkpoint ids the Control remembers
// to refuse with ErrStaleCheckpoint; a stale controller retries within
// moments, so this is plenty.
const ResumedIDsKept = 64

// Config sets up a Control.
type Config struct {
	// Instance is the server's instance name (a NamePattern name); records
	// live under <checkpoint_dir>/gym/<kind>/<Instance>.
	Instance string
	// LeaseGrace is Gym's lease_grace_seconds: how long past a request's
	// deadline_ts the checkpoint stays open without another call.
	LeaseGrace time.Duration
	// Logf receives what is worth a line in the log (a lease expiry, a
	// failed park); log.Printf when nil.
	Logf func(format string, args ...any)
}

// Control is Gym's ParticipantControlPlane: checkpoint-id fencing, the
// phase machine, idempotent replay of completed operations, the lease,
// retire marks and manifest-last storage, driving one Participant. Its
// methods are the routes; Handler puts them on HTTP. Operations are
// serialized by one lock, except that prepare waits for readiness outside
// it, so a controller can resume while a prepare waits. Status never waits
// for an operation.
type Control struct {
	p        Participant
	instance string
	grace    float64
	logf     func(string, ...any)

	op chan struct{} // the operation lock (Gym's asyncio.Lock)

	mu           sync.Mutex // guards everything below; never held across a participant call
	phase        Phase
	checkpointID string  // "" when none is active
	leaseEnd     float64 // epoch seconds; 0 when no lease
	lease        *leaseWatch
	resumed      []string
	resumedSet   map[string]bool
	results      map[resultKey]any
	write        *pendingWrite
	install      *run
	retired      map[string]int
	changed      chan struct{}
}

type resultKey struct{ checkpointID, op string }

// run is one piece of work done in its own goroutine (a write, an install)
// that an operation may stop waiting for while it goes on.
type run struct {
	done     chan struct{}
	manifest Manifest
	err      error
}

func (r *run) finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

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

type leaseWatch struct {
	checkpointID string
	timer        *time.Timer
}

// NewControl returns the control plane for p.
func NewControl(p Participant, cfg Config) (*Control, error) {
	if _, err := ParticipantDir("/", p.Kind(), cfg.Instance); err != nil {
		return nil, err
	}
	if cfg.LeaseGrace < 0 {
		return nil, Refuse(ErrInvalidRequest, "lease grace %v must not be negative", cfg.LeaseGrace)
	}
	logf := cfg.Logf
	if logf == nil {
		logf = log.Printf
	}
	return &Control{
		p: p, instance: cfg.Instance, grace: cfg.LeaseGrace.Seconds(), logf: logf,
		op: make(chan struct{}, 1), phase: PhaseIdle,
		resumedSet: map[string]bool{}, results: map[resultKey]any{},
		retired: map[string]int{}, changed: make(chan struct{}),
	}, nil
}

// Notify wakes a prepare waiting for readiness. A participant calls it
// whenever its readiness may have changed; it never blocks.
func (c *Control) Notify() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

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

// Status answers GET status.
func (c *Control) Status() StatusReply {
	c.mu.Lock()
	s := StatusReply{Kind: c.p.Kind(), Instance: c.instance, Phase: c.phase, RetiredRollouts: len(c.retired)}
	if c.checkpointID != "" {
		id := c.checkpointID
		s.CheckpointID = &id
	}
	if c.leaseEnd != 0 {
		end := c.leaseEnd
		s.LeaseExpiresAt = &end
	}
	c.mu.Unlock()
	s.Report = c.p.Readiness()
	if x, ok := c.p.(StatusExtender); ok {
		s.Extra = x.StatusExtra()
	}
	return s
}

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
			return nil, err
		}
		w = &pendingWrite{checkpointID: req.CheckpointID, dir: req.CheckpointDir, scope: slices.Clone(req.EpisodeIDs), records: records, stop: &WriteStop{}}
		c.mu.Lock()
		c.write = w
		c.mu.Unlock()
	} else if w.dir != req.CheckpointDir || !sameScope(w.scope, req.EpisodeIDs) {
		return nil, Refuse(ErrCheckpointConflict, "checkpoint %q is already being written to another directory or scope", req.CheckpointID)
	}
	if w.run == nil || (w.run.finished() && w.run.err != nil) {
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

// admitLocked is the fence of every checkpoint operation: a resumed id is
// stale, another active id conflicts, and the phase must allow op.
func (c *Control) admitLocked(checkpointID, op string) error {
	if c.resumedSet[checkpointID] {
		return Refuse(ErrStaleCheckpoint, "checkpoint %q was already resumed", checkpointID)
	}
	if c.checkpointID != "" && c.checkpointID != checkpointID {
		return Refuse(ErrCheckpointConflict, "checkpoint %q is active in phase %s", c.checkpointID, c.phase)
	}
	if !slices.Contains(allowed[op], c.phase) {
		return Refuse(ErrInvalidPhase, "not valid in phase %s", c.phase)
	}
	return nil
}

// admitOutsideCheckpoint is the fence of retire and forget: their own
// checkpoint id is only checked against an active restore's, and a
// resumed id is no obstacle.
func (c *Control) admitOutsideCheckpoint(req Request, op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(allowed[op], c.phase) {
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

func (c *Control) replay(checkpointID, op string) (any, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.results[resultKey{checkpointID, op}]
	return r, ok
}

func (c *Control) currentPhase() Phase {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.phase
}

func (c *Control) rememberLocked(checkpointID string) {
	if c.resumedSet[checkpointID] {
		return
	}
	c.resumed = append(c.resumed, checkpointID)
	c.resumedSet[checkpointID] = true
	for len(c.resumed) > ResumedIDsKept {
		delete(c.resumedSet, c.resumed[0])
		c.resumed = c.resumed[1:]
	}
}

// reopen ends the open checkpoint (a resume when resumeID is set, else an
// abort of a failed prepare): the write is stopped before it can publish,
// admission reopens, and the phase goes back to idle. If reopening
// admission fails the phase stays, so a retried resume tries again.
func (c *Control) reopen(ctx context.Context, resumeID string) error {
	c.mu.Lock()
	w := c.write
	c.write = nil
	c.mu.Unlock()
	if w != nil {
		w.stop.Stop() // waits only for a publication already under way
	}
	if err := c.p.OpenAdmission(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	c.mu.Lock()
	if resumeID != "" {
		c.rememberLocked(resumeID)
		for k := range c.results {
			if k.checkpointID == resumeID {
				delete(c.results, k)
			}
		}
	}
	c.phase, c.checkpointID, c.leaseEnd = PhaseIdle, "", 0
	if c.lease != nil {
		c.lease.timer.Stop()
		c.lease = nil
	}
	c.mu.Unlock()
	c.Notify()
	return nil
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

// within runs f with a context that ends at the request's deadline, and
// refuses at once if the deadline has passed (Gym's _within).
func (c *Control) within(ctx context.Context, req Request, f func(context.Context) error) error {
	if req.DeadlineTS-nowSeconds() <= 0 {
		return Refuse(ErrDeadlineExceeded, "checkpoint %q deadline passed", req.CheckpointID)
	}
	dctx, cancel := context.WithDeadline(ctx, req.Deadline())
	defer cancel()
	err := f(dctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return refuseCause(ErrDeadlineExceeded, err, "checkpoint %q deadline passed during I/O", req.CheckpointID)
	}
	return err
}

// await waits for done up to the request's deadline; the work goes on.
func (c *Control) await(ctx context.Context, req Request, done <-chan struct{}) error {
	return c.within(ctx, req, func(ctx context.Context) error {
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

func (c *Control) lock(ctx context.Context) error {
	select {
	case c.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Control) unlock() { <-c.op }

func nowSeconds() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
