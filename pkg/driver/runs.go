package driver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/gym"
)

// runState is what a registered run is doing, as a checkpoint sees it. The
// table is the whole of it (Gym's episode steps, steps.py):
//
//	state    where                           blocks prepare  exported at
//	queued   waiting for a concurrency slot  no              its bookmark (seed, or the restored one)
//	replay   seed, a replay verify           no              the bookmark recorded before the step
//	waiting  the harness, a wait verify      yes             -
//	parked   held at a bookmark              no              that bookmark (a paused launch in it)
//
// A step that ends while a checkpoint is open parks the run at its next
// bookmark (return included: the reply waits for the resume). A restart
// run (the owner cannot capture its session) never blocks, never parks and
// is never exported: it is reported in Report.Restarts, and becomes one
// only while no checkpoint is open. A retired run blocks until it has
// ended.
type runState int

const (
	runQueued runState = iota
	runReplay
	runWaiting
	runParked
)

func (s runState) String() string {
	return [...]string{"queued", "replay", "waiting", "parked"}[s]
}

// run is a registered run: one attempt of one rollout.
type run struct {
	id       gym.EpisodeID
	state    runState
	bookmark Bookmark
	restart  bool
	// launch is the launch a park left paused (killed by a commit with
	// stop); its stopper ends it.
	launch  *launch.Ref
	stopper func(context.Context) error
	killed  bool
	// cancel ends the run (a retire); done is closed once it unregistered.
	cancel  context.CancelCauseFunc
	done    chan struct{}
	retired bool
}

func (r *run) blocks() bool {
	return r.retired || (!r.restart && r.state == runWaiting)
}

func (r *run) exportable() bool {
	return !r.retired && !r.restart && r.state != runWaiting
}

// gate is one checkpoint's request to park, and its opening.
type gate struct {
	park chan struct{} // closed: runs must park
	open chan struct{} // closed: parked runs go on
}

func newGate() *gate {
	return &gate{park: make(chan struct{}), open: make(chan struct{})}
}

// restored is a run a restore installed, waiting for its attempt's /run.
type restored struct {
	id       gym.EpisodeID // the attempt that continues it (record's + 1)
	bookmark Bookmark
	record   gym.Record // as read, exported again until claimed
}

// registry is the Participant's table of runs, its checkpoint gate and its
// restored records. Every field is guarded by mu.
type registry struct {
	mu       sync.Mutex
	runs     map[string]*run // by rollout id: one attempt of a rollout at a time
	slots    chan struct{}
	gate     *gate // the checkpoint holding admission closed, nil when open
	next     *gate // the next checkpoint's, made ahead so runs can wait on it
	changed  chan struct{}
	restored map[string]*restored // by rollout id
	closing  bool
	notify   func() // tells the control plane readiness may have changed
}

// changedLocked wakes everyone waiting for a change. Call with mu held.
func (g *registry) changedLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
	if g.notify != nil {
		g.notify()
	}
}

// register adds a run at its first bookmark, before it waits for a slot.
// A restored record of the rollout is claimed here, by its attempt only:
// the run continues from it, once. Refused: a retired attempt
// (gym.ErrStaleAttempt), another attempt of a restored rollout
// (gym.ErrStaleAttempt), a new rollout while a checkpoint holds admission
// closed (gym.ErrCheckpointParked), a rollout already in flight
// (ErrDuplicateRun), and anything while shutting down.
func (p *Participant) register(id gym.EpisodeID, check func(gym.EpisodeID) error) (*run, error) {
	if check != nil {
		if err := check(id); err != nil {
			return nil, err
		}
	}
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return nil, ErrShuttingDown
	}
	if other, ok := g.runs[id.RolloutID]; ok {
		return nil, fmt.Errorf("%w: rollout %s is running as %s", ErrDuplicateRun, id.RolloutID, other.id.CaptureKey())
	}
	r := &run{id: id, state: runQueued, bookmark: Bookmark{V: BookmarkVersion, Next: StageSeed}, done: make(chan struct{})}
	if rs, ok := g.restored[id.RolloutID]; ok {
		if rs.id != id {
			return nil, gym.Refuse(gym.ErrStaleAttempt, "rollout %q was restored to continue as %s, not %s", id.RolloutID, rs.id.CaptureKey(), id.CaptureKey())
		}
		delete(g.restored, id.RolloutID)
		r.bookmark = rs.bookmark.Clone()
	} else if g.gate != nil {
		return nil, gym.Refuse(gym.ErrCheckpointParked, "agent admission is closed for a checkpoint; post %s again once it resumes", id.CaptureKey())
	}
	g.runs[id.RolloutID] = r
	g.changedLocked()
	return r, nil
}

func (p *Participant) unregister(r *run) {
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.runs[r.id.RolloutID] == r {
		delete(g.runs, r.id.RolloutID)
	}
	close(r.done)
	g.changedLocked()
}

// acquire takes a concurrency slot, never while a checkpoint asks runs to
// park: a queued run is exported at its bookmark and starts after the
// checkpoint opens. Parked runs keep their slots.
func (p *Participant) acquire(ctx context.Context, r *run) error {
	g := &p.reg
	for {
		g.mu.Lock()
		gt := g.gate
		g.mu.Unlock()
		if gt != nil && !r.restart {
			select {
			case <-gt.open:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			continue
		}
		if g.slots != nil {
			select {
			case g.slots <- struct{}{}:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		g.mu.Lock()
		if g.gate != nil && !r.restart {
			// A checkpoint began while we took the slot: give it back.
			g.mu.Unlock()
			p.release()
			continue
		}
		r.state = runReplay
		g.changedLocked()
		g.mu.Unlock()
		return nil
	}
}

func (p *Participant) release() {
	if p.reg.slots != nil {
		<-p.reg.slots
	}
}

// record stores the run's bookmark (a copy) and what it is doing.
func (p *Participant) record(r *run, b Bookmark, state runState) {
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	r.bookmark = b.Clone()
	r.restart = b.Restart
	r.state = state
	g.changedLocked()
}

// parkRequested returns a channel closed when a checkpoint asks runs to
// park: the current one's, or the next one's (never closed for a restart
// run, which is never parked).
func (p *Participant) parkRequested(r *run) <-chan struct{} {
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.restart {
		return nil
	}
	if g.gate != nil {
		return g.gate.park
	}
	return g.next.park
}

// parking reports whether a checkpoint asks runs to park now.
func (p *Participant) parking(r *run) bool {
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gate != nil && !r.restart
}

// park holds the run at bookmark b until the checkpoint opens. paused, if
// not nil, is a launch left paused, which a commit with stop ends through
// stopper. It reports whether that launch was killed meanwhile (the run
// must then relaunch).
func (p *Participant) park(ctx context.Context, r *run, b Bookmark, paused *launch.Ref, stopper func(context.Context) error) (killed bool, err error) {
	g := &p.reg
	g.mu.Lock()
	r.bookmark = b.Clone()
	r.state = runParked
	r.launch, r.stopper, r.killed = paused, stopper, false
	gt := g.gate
	g.changedLocked()
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		killed = r.killed
		r.launch, r.stopper, r.killed = nil, nil, false
		r.state = runWaiting
		g.changedLocked()
		g.mu.Unlock()
	}()
	if gt == nil {
		return false, nil
	}
	select {
	case <-gt.open:
		return false, nil
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
}

// RunInfo describes a registered run, for metrics and tests.
type RunInfo struct {
	RolloutID string
	Attempt   int
	State     string
	Next      Stage
}

// Runs lists the registered runs, by rollout id.
func (p *Participant) Runs() []RunInfo {
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]RunInfo, 0, len(g.runs))
	for _, r := range g.runs {
		out = append(out, RunInfo{RolloutID: r.id.RolloutID, Attempt: r.id.Attempt, State: r.state.String(), Next: r.bookmark.Next})
	}
	slices.SortFunc(out, func(a, b RunInfo) int { return strings.Compare(a.RolloutID, b.RolloutID) })
	return out
}

// WaitFor blocks until cond holds over the registered runs or ctx ends.
func (p *Participant) WaitFor(ctx context.Context, cond func([]RunInfo) bool) error {
	for {
		p.reg.mu.Lock()
		changed := p.reg.changed
		p.reg.mu.Unlock()
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

// Close stops taking runs (ErrShuttingDown).
func (p *Participant) Close() {
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	p.reg.closing = true
	p.reg.changedLocked()
}

// maxNamed bounds the rollouts an error names.
const maxNamed = 10

// nameSome lists at most n of ids, saying how many more there are.
func nameSome(ids []string, n int) string {
	if len(ids) <= n {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:n], ", "), len(ids)-n)
}

// setCancel gives the run the cancel of its context, so a retire can end
// it; a run retired before it got here is cancelled at once.
func (p *Participant) setCancel(r *run, cancel context.CancelCauseFunc) {
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	r.cancel = cancel
	if r.retired {
		cancel(fmt.Errorf("%w: %s was retired by the controller", ErrCancelled, r.id.CaptureKey()))
	}
}

// awaitOpen waits until no checkpoint holds admission closed. A run the
// owner cannot capture becomes a restart only then (Gym's mark_restart):
// the episodes a checkpoint exports and the restarts it reports never
// change while it is open.
func (p *Participant) awaitOpen(ctx context.Context) error {
	for {
		p.reg.mu.Lock()
		gt := p.reg.gate
		p.reg.mu.Unlock()
		if gt == nil {
			return nil
		}
		select {
		case <-gt.open:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}
