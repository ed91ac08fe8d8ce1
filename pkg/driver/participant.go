package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Phase is where a participant is in the checkpoint protocol.
type Phase string

// Phases: idle -> preparing -> prepared -> committed | restored, and back to
// idle on resume.
const (
	PhaseIdle      Phase = "idle"
	PhasePreparing Phase = "preparing"
	PhasePrepared  Phase = "prepared"
	PhaseCommitted Phase = "committed"
	PhaseRestored  Phase = "restored"
)

// transitions lists, in one place, which call is allowed in which phase.
var transitions = map[string][]Phase{
	"prepare": {PhaseIdle, PhaseRestored},
	"commit":  {PhasePrepared},
	"resume":  {PhasePreparing, PhasePrepared, PhaseCommitted, PhaseRestored},
	"restore": {PhaseIdle},
	"retire":  {PhaseIdle, PhaseCommitted, PhaseRestored},
}

// Record is one run as a checkpoint exports it: enough to continue it once
// on the next attempt after a crash.
type Record struct {
	// RolloutID and Attempt identify the run; the next attempt continues.
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
	// Bookmark is where it continues.
	Bookmark json.RawMessage `json:"bookmark"`
}

// runState is what a registered run is doing, as a checkpoint sees it.
type runState int

const (
	// runQueued: waiting for a concurrency slot; exportable at its bookmark.
	runQueued runState = iota
	// runReplay: in a replay step (seed, verify, return): exportable at the
	// bookmark recorded before it; after a crash the step runs again.
	runReplay
	// runWaiting: in the harness step; a checkpoint waits until it parks.
	runWaiting
	// runParked: held at its bookmark until the checkpoint opens.
	runParked
)

func (s runState) String() string {
	return [...]string{"queued", "replay", "waiting", "parked"}[s]
}

// run is a registered run.
type run struct {
	rollout  string
	attempt  int
	state    runState
	bookmark Bookmark
	restart  bool
	// launch is the launch a park left paused (killed by a commit with
	// stop); its stopper ends it.
	launch  *LaunchRef
	stopper func(context.Context) error
	killed  bool
}

// gate is one checkpoint's request to park, and its opening.
type gate struct {
	park chan struct{} // closed: runs must park
	open chan struct{} // closed: parked runs go on
}

func newGate() *gate {
	return &gate{park: make(chan struct{}), open: make(chan struct{})}
}

// Participant is the checkpoint participant of one driver: it registers
// every run (before it waits for a slot), asks them to park at a checkpoint,
// exports their bookmarks, and lets them go on. The HTTP control plane is a
// thin layer over it.
type Participant struct {
	mu      sync.Mutex
	runs    map[string]*run
	slots   chan struct{}
	phase   Phase
	gate    *gate // the checkpoint in progress, nil when none
	next    *gate // the next checkpoint's, made ahead so runs can wait on it
	changed chan struct{}
	// restored holds the restored records whose rollouts have not come
	// back yet; each is exported by every prepare until its run claims it.
	restored map[string]Record
	closing  bool
	// exported is the last prepare's export, for commit.
	exported []Record
	current  string // checkpoint id of the phase in progress
}

// NewParticipant makes a participant allowing maxRuns runs in flight (0: no
// limit).
func NewParticipant(maxRuns int) *Participant {
	p := &Participant{
		runs:     map[string]*run{},
		phase:    PhaseIdle,
		changed:  make(chan struct{}),
		restored: map[string]Record{},
		next:     newGate(),
	}
	if maxRuns > 0 {
		p.slots = make(chan struct{}, maxRuns)
	}
	return p
}

// notify wakes everyone waiting for a change. Call with mu held.
func (p *Participant) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Phase returns the current phase.
func (p *Participant) Phase() Phase {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.phase
}

func (p *Participant) allowed(call string) error {
	if slices.Contains(transitions[call], p.phase) {
		return nil
	}
	return fmt.Errorf("%w: cannot %s in %s", ErrPhase, call, p.phase)
}

// register adds a run at its first bookmark, before it waits for a slot. A
// restored record for the rollout is consumed here: the run continues from
// it, once.
func (p *Participant) register(rollout string, attempt int) (*run, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return nil, ErrShuttingDown
	}
	if _, ok := p.runs[rollout]; ok {
		return nil, fmt.Errorf("%w: rollout %s", ErrDuplicateRun, rollout)
	}
	r := &run{rollout: rollout, attempt: attempt, state: runQueued, bookmark: Bookmark{V: BookmarkVersion, Next: StageSeed}}
	if rec, ok := p.restored[rollout]; ok {
		delete(p.restored, rollout)
		b, err := ParseBookmark(rec.Bookmark)
		if err != nil {
			return nil, fmt.Errorf("continue rollout %s from its restored bookmark: %w", rollout, err)
		}
		r.bookmark = b
		r.restart = b.Restart
		r.attempt = rec.Attempt + 1
		if b.Restart {
			// Nothing could be saved: start over from the input.
			r.bookmark = Bookmark{V: BookmarkVersion, Next: StageSeed, Restart: true}
		}
	}
	p.runs[rollout] = r
	p.notify()
	return r, nil
}

func (p *Participant) unregister(r *run) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runs[r.rollout] == r {
		delete(p.runs, r.rollout)
	}
	p.notify()
}

// acquire takes a concurrency slot, never while a checkpoint asks runs to
// park: a queued run is exported at its bookmark and starts after the
// checkpoint opens. Parked runs keep their slots.
func (p *Participant) acquire(ctx context.Context, r *run) error {
	for {
		p.mu.Lock()
		g := p.gate
		p.mu.Unlock()
		if g != nil {
			select {
			case <-g.open:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			continue
		}
		if p.slots != nil {
			select {
			case p.slots <- struct{}{}:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		p.mu.Lock()
		if p.gate != nil {
			// A checkpoint began while we took the slot: give it back.
			p.mu.Unlock()
			p.release()
			continue
		}
		r.state = runReplay
		p.notify()
		p.mu.Unlock()
		return nil
	}
}

func (p *Participant) release() {
	if p.slots != nil {
		<-p.slots
	}
}

// record stores the run's bookmark (a copy) and what it is doing.
func (p *Participant) record(r *run, b Bookmark, state runState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r.bookmark = b.Clone()
	r.restart = b.Restart
	r.state = state
	p.notify()
}

// parkRequested returns a channel closed when a checkpoint asks runs to
// park: the current one's, or the next one's (never closed for a restart
// run, which is never parked).
func (p *Participant) parkRequested(r *run) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.restart {
		return nil
	}
	if p.gate != nil {
		return p.gate.park
	}
	return p.next.park
}

// parking reports whether a checkpoint asks runs to park now.
func (p *Participant) parking(r *run) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gate != nil && !r.restart
}

// park holds the run at bookmark b until the checkpoint opens. launch, if
// not nil, is a launch left paused, which a commit with stop ends through
// stopper. It reports whether that launch was killed meanwhile (the run
// must then relaunch).
func (p *Participant) park(ctx context.Context, r *run, b Bookmark, launch *LaunchRef, stopper func(context.Context) error) (killed bool, err error) {
	p.mu.Lock()
	r.bookmark = b.Clone()
	r.state = runParked
	r.launch, r.stopper, r.killed = launch, stopper, false
	g := p.gate
	p.notify()
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		killed = r.killed
		r.launch, r.stopper, r.killed = nil, nil, false
		r.state = runWaiting
		p.notify()
		p.mu.Unlock()
	}()
	if g == nil {
		return false, nil
	}
	select {
	case <-g.open:
		return false, nil
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
}

// PrepareResult is the answer to prepare.
type PrepareResult struct {
	// CheckpointID echoes the request.
	CheckpointID string `json:"checkpoint_id"`
	// Parked is true when every run was exported in time.
	Parked bool `json:"parked"`
	// Records are the exported runs.
	Records []Record `json:"records"`
	// NotParked names the runs still running at the deadline.
	NotParked []string `json:"not_parked"`
	// ElapsedMS is how long the prepare took.
	ElapsedMS int64 `json:"elapsed_ms"`
}

// Prepare asks every run to park and waits until each is exported (parked,
// queued, or in a replay step) or the deadline passes.
func (p *Participant) Prepare(ctx context.Context, checkpointID string, deadline time.Time) (PrepareResult, error) {
	begin := time.Now()
	res := PrepareResult{CheckpointID: checkpointID}
	p.mu.Lock()
	switch {
	case p.phase == PhasePreparing && checkpointID == p.current:
		// A prepare that missed its deadline, asked again: wait again.
	default:
		if err := p.allowed("prepare"); err != nil {
			p.mu.Unlock()
			return res, err
		}
		p.phase = PhasePreparing
		p.current = checkpointID
		p.gate, p.next = p.next, newGate()
		close(p.gate.park)
		p.notify()
	}
	g := p.gate // this checkpoint's request to park
	p.mu.Unlock()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		p.mu.Lock()
		var waiting []string
		for _, r := range p.runs {
			if r.state == runWaiting && !r.restart {
				waiting = append(waiting, r.rollout)
			}
		}
		if p.gate != g {
			// Resumed while this prepare waited: the checkpoint is closed
			// and its runs go on; there is nothing left to claim.
			p.mu.Unlock()
			slices.Sort(waiting)
			res.NotParked = waiting
			res.ElapsedMS = time.Since(begin).Milliseconds()
			return res, fmt.Errorf("%w: checkpoint %s was resumed before every run parked", ErrPhase, checkpointID)
		}
		changed := p.changed
		if len(waiting) == 0 {
			res.Records = p.exportLocked()
			p.exported = res.Records
			res.Parked = true
			p.phase = PhasePrepared
			p.mu.Unlock()
			res.NotParked = []string{}
			res.ElapsedMS = time.Since(begin).Milliseconds()
			return res, nil
		}
		p.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			slices.Sort(waiting)
			p.mu.Lock()
			res.Records = p.exportLocked()
			p.mu.Unlock()
			res.NotParked = waiting
			res.ElapsedMS = time.Since(begin).Milliseconds()
			return res, nil
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
}

// exportLocked returns every exportable run's record, sorted by rollout.
// A restored record whose rollout has not come back yet (its next /run has
// not arrived) is exported unchanged: it is still that rollout's latest
// bookmark, and a checkpoint taken between a restore and the runs posted
// again must not drop it, or a second crash would start those rollouts
// over.
func (p *Participant) exportLocked() []Record {
	out := []Record{}
	for _, r := range p.runs {
		if r.restart || r.state == runWaiting {
			continue
		}
		data, err := r.bookmark.Marshal()
		if err != nil {
			continue
		}
		out = append(out, Record{RolloutID: r.rollout, Attempt: r.attempt, Bookmark: data})
	}
	for _, rec := range p.restored {
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b Record) int {
		switch {
		case a.RolloutID < b.RolloutID:
			return -1
		case a.RolloutID > b.RolloutID:
			return 1
		}
		return 0
	})
	return out
}

// Commit accepts the prepared export as committed (the caller has written
// it durably). With stop, every launch a park left paused is killed now.
func (p *Participant) Commit(ctx context.Context, checkpointID string, stop bool) ([]Record, error) {
	p.mu.Lock()
	if err := p.allowed("commit"); err != nil {
		p.mu.Unlock()
		return nil, err
	}
	if checkpointID != p.current {
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: cannot commit %s while %s is prepared", ErrPhase, checkpointID, p.current)
	}
	recs := p.exported
	var stoppers []*run
	if stop {
		for _, r := range p.runs {
			if r.state == runParked && r.stopper != nil {
				stoppers = append(stoppers, r)
			}
		}
	}
	p.phase = PhaseCommitted
	p.mu.Unlock()
	var errs []error
	for _, r := range stoppers {
		if err := r.stopper(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop the launch of %s: %w", r.rollout, err))
		}
		p.mu.Lock()
		r.killed = true
		p.mu.Unlock()
	}
	if len(errs) > 0 {
		return recs, fmt.Errorf("commit %s: %w", checkpointID, joinErrs(errs))
	}
	return recs, nil
}

// Resume opens the checkpoint: parked runs go on (a paused harness
// continues in place), queued runs may take slots.
func (p *Participant) Resume(checkpointID string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.allowed("resume"); err != nil {
		return err
	}
	if p.gate != nil {
		close(p.gate.open)
		p.gate = nil
	}
	// A run parked at this checkpoint is about to continue: it is no longer
	// held, so a prepare that follows at once must wait for it to park
	// again rather than export it while its harness goes on.
	for _, r := range p.runs {
		if r.state == runParked {
			r.state = runWaiting
		}
	}
	p.phase = PhaseIdle
	p.exported = nil
	p.notify()
	return nil
}

// Restore installs committed records after a crash: the next run of each
// rollout continues from its bookmark, once. A record whose bookmark does
// not parse costs only its own rollout: every record is installed, the bad
// ones too, so the next run of such a rollout fails with an error naming
// its bookmark (instead of silently starting over), and the others continue.
// The error returned names every bad record (it wraps ErrBadBookmark or
// ErrBookmarkVersion); the restore has still taken place.
func (p *Participant) Restore(checkpointID string, records []Record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.restorableLocked(); err != nil {
		return err
	}
	var bad []error
	for _, rec := range records {
		if _, err := ParseBookmark(rec.Bookmark); err != nil {
			bad = append(bad, fmt.Errorf("restore %s: rollout %s: %w", checkpointID, rec.RolloutID, err))
		}
		p.restored[rec.RolloutID] = rec
	}
	p.current = checkpointID
	p.phase = PhaseRestored
	p.notify()
	return joinErrs(bad)
}

// maxNamed bounds the rollouts an error names.
const maxNamed = 10

// CanRestore reports whether a restore would be accepted now: in idle, with
// no run in flight. A restore under live runs would install records their
// rollouts then cannot claim; the error (ErrRunsInFlight) names them.
func (p *Participant) CanRestore() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restorableLocked()
}

func (p *Participant) restorableLocked() error {
	if err := p.allowed("restore"); err != nil {
		return err
	}
	if len(p.runs) == 0 {
		return nil
	}
	live := make([]string, 0, len(p.runs))
	for id := range p.runs {
		live = append(live, id)
	}
	slices.Sort(live)
	return fmt.Errorf("%w: cannot restore while %d runs are in flight: %s", ErrRunsInFlight, len(live), nameSome(live, maxNamed))
}

// nameSome lists at most n of ids, saying how many more there are.
func nameSome(ids []string, n int) string {
	if len(ids) <= n {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:n], ", "), len(ids)-n)
}

// Retire forgets a finished checkpoint; a restored phase goes back to idle.
func (p *Participant) Retire(checkpointID string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.allowed("retire"); err != nil {
		return err
	}
	if p.phase != PhaseCommitted {
		p.phase = PhaseIdle
	}
	return nil
}

// RunInfo describes a registered run, for metrics and tests.
type RunInfo struct {
	RolloutID string
	Attempt   int
	State     string
	Next      Stage
}

// Runs lists the registered runs.
func (p *Participant) Runs() []RunInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]RunInfo, 0, len(p.runs))
	for _, r := range p.runs {
		out = append(out, RunInfo{RolloutID: r.rollout, Attempt: r.attempt, State: r.state.String(), Next: r.bookmark.Next})
	}
	slices.SortFunc(out, func(a, b RunInfo) int {
		if a.RolloutID < b.RolloutID {
			return -1
		}
		if a.RolloutID > b.RolloutID {
			return 1
		}
		return 0
	})
	return out
}

// WaitFor blocks until cond holds over the registered runs or ctx ends.
func (p *Participant) WaitFor(ctx context.Context, cond func([]RunInfo) bool) error {
	for {
		p.mu.Lock()
		changed := p.changed
		p.mu.Unlock()
		if cond(p.Runs()) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close stops taking runs.
func (p *Participant) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closing = true
	p.notify()
}

// Exported returns the records the prepare of checkpointID exported, for a
// commit to write before it commits.
func (p *Participant) Exported(checkpointID string) ([]Record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.allowed("commit"); err != nil {
		return nil, err
	}
	if checkpointID != p.current {
		return nil, fmt.Errorf("%w: cannot commit %s while %s is prepared", ErrPhase, checkpointID, p.current)
	}
	return append([]Record(nil), p.exported...), nil
}
