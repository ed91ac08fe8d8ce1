package gym

import (
	"context"
	"errors"
	"log"
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
// methods are the routes (prepare.go, commit.go, restore.go, retire.go,
// lease.go); the routes table (routes.go) says what each takes and in
// which phases, and NewHandler puts them on HTTP. Operations are
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

// admitLocked is the fence of every checkpoint operation: a resumed id is
// stale, another active id conflicts, and the phase must allow op.
func (c *Control) admitLocked(checkpointID, op string) error {
	if c.resumedSet[checkpointID] {
		return Refuse(ErrStaleCheckpoint, "checkpoint %q was already resumed", checkpointID)
	}
	if c.checkpointID != "" && c.checkpointID != checkpointID {
		return Refuse(ErrCheckpointConflict, "checkpoint %q is active in phase %s", c.checkpointID, c.phase)
	}
	if !routeOf[op].allows(c.phase) {
		return Refuse(ErrInvalidPhase, "not valid in phase %s", c.phase)
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
