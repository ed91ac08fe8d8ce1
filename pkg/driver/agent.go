package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/gym"
)

// Participant is the driver's checkpoint participant: Gym's agent
// participant (kind "agent", nemo_gym/_checkpoint/agent.py at 00675de) for
// legacy /run episodes. Every run is registered before it waits for a slot;
// a checkpoint closes admission, runs park at their next bookmark (a
// harness paused in place), their bookmarks are exported as records, and
// reopening admission lets them go on. The gym.Control returned by Control
// drives it: phases, fencing, the lease, storage and retire marks are the
// control plane's.
type Participant struct {
	reg     registry
	adapter string
	control *gym.Control
}

// ParticipantConfig sets up a Participant.
type ParticipantConfig struct {
	// MaxRuns bounds the runs in flight (0: no limit).
	MaxRuns int
	// Adapter names the harness adapter; every record carries it, and a
	// restore refuses records of another adapter.
	Adapter string
	// Instance is the server's Gym instance name: records live under
	// <checkpoint_dir>/gym/agent/<Instance>. DefaultInstance when empty.
	Instance string
	// LeaseGrace is Gym's lease_grace_seconds (DefaultLeaseGrace when 0).
	LeaseGrace time.Duration
	// Logf receives the control plane's log lines (log.Printf when nil).
	Logf func(format string, args ...any)
}

// DefaultInstance is the instance name of a driver configured without one.
const DefaultInstance = "ngdriver"

// DefaultLeaseGrace is Gym's default lease_grace_seconds.
const DefaultLeaseGrace = 600 * time.Second

// NewParticipant makes a participant and its control plane.
func NewParticipant(cfg ParticipantConfig) (*Participant, error) {
	if cfg.Instance == "" {
		cfg.Instance = DefaultInstance
	}
	if cfg.LeaseGrace == 0 {
		cfg.LeaseGrace = DefaultLeaseGrace
	}
	p := &Participant{adapter: cfg.Adapter}
	p.reg = registry{
		runs: map[string]*run{}, changed: make(chan struct{}),
		restored: map[string]*restored{}, next: newGate(),
	}
	if cfg.MaxRuns > 0 {
		p.reg.slots = make(chan struct{}, cfg.MaxRuns)
	}
	ctl, err := gym.NewControl(p, gym.Config{Instance: cfg.Instance, LeaseGrace: cfg.LeaseGrace, Logf: cfg.Logf})
	if err != nil {
		return nil, fmt.Errorf("set up the agent participant: %w", err)
	}
	p.control = ctl
	p.reg.notify = ctl.Notify
	return p, nil
}

// MustParticipant is NewParticipant for a configuration known to be valid
// (tests, the in-process `ngdriver run`); it panics otherwise.
func MustParticipant(cfg ParticipantConfig) *Participant {
	p, err := NewParticipant(cfg)
	if err != nil {
		panic(err)
	}
	return p
}

// Control is the participant's control plane: the checkpoint routes.
func (p *Participant) Control() *gym.Control { return p.control }

// Kind implements gym.Participant.
func (p *Participant) Kind() string { return gym.KindAgent }

// AgentRecord is one run as a checkpoint stores it (Gym's
// AgentSessionRecord): the attempt, the session key (the rollout id, so
// the replacement attempt finds it), the harness's session, and the run's
// own step. Boundary is Gym's native-session boundary: null, since a
// legacy /run has none beside its episode step.
type AgentRecord struct {
	EpisodeID  gym.EpisodeID   `json:"episode_id"`
	SessionKey string          `json:"session_key"`
	Session    AgentSession    `json:"session"`
	Boundary   json.RawMessage `json:"boundary"`
	// Episode is the bookmark without the adapter's state (which is the
	// session's): the step that comes next and what it needs.
	Episode json.RawMessage `json:"episode"`
}

// AgentSession is the harness's part of a record: which adapter, and its
// state (where the harness keeps its session; absent before the seed).
type AgentSession struct {
	Adapter string          `json:"adapter"`
	State   json.RawMessage `json:"state,omitempty"`
}

// newRecord builds the record of a run at bookmark b.
func (p *Participant) newRecord(id gym.EpisodeID, b Bookmark) (gym.Record, error) {
	state := b.State
	b.State = nil
	episode, err := b.Marshal()
	if err != nil {
		return gym.Record{}, fmt.Errorf("export %s: %w", id.CaptureKey(), err)
	}
	return gym.NewRecord(AgentRecord{
		EpisodeID: id, SessionKey: id.RolloutID,
		Session:  AgentSession{Adapter: p.adapter, State: state},
		Boundary: json.RawMessage("null"), Episode: episode,
	})
}

// ParseAgentRecord reads a stored agent record back into its bookmark,
// validated field for field as Gym's AgentSessionRecord validates it
// (extra="forbid": episode_id, session_key and session required, boundary
// and episode optional, no other field, names spelled exactly; a string
// is a string), and then as this driver needs it: the session's adapter
// named, no native boundary (a legacy /run has none to continue from),
// and a bookmark in episode. Errors wrap gym.ErrCheckpointState and name
// the episode.
func ParseAgentRecord(r gym.Record) (AgentRecord, Bookmark, error) {
	var rec AgentRecord
	if err := r.DecodeStrict(&rec, "episode_id", "session_key", "session"); err != nil {
		return rec, Bookmark{}, err
	}
	key := r.EpisodeID.CaptureKey()
	if rec.SessionKey != r.EpisodeID.RolloutID {
		return rec, Bookmark{}, gym.Refuse(gym.ErrCheckpointState, "agent record %s has session_key %q, want its rollout id", key, rec.SessionKey)
	}
	if rec.Session.Adapter == "" {
		return rec, Bookmark{}, gym.Refuse(gym.ErrCheckpointState, "agent record %s: its session names no adapter", key)
	}
	if b := bytes.TrimSpace(rec.Boundary); len(b) > 0 && string(b) != "null" {
		return rec, Bookmark{}, gym.Refuse(gym.ErrCheckpointState, "agent record %s has a boundary; a legacy /run episode continues from its episode step only, so boundary must be null", key)
	}
	b, err := decodeBookmark(rec.Episode)
	if err == nil {
		if len(rec.Session.State) > 0 {
			b.State = rec.Session.State
		}
		err = b.Validate()
	}
	if err != nil {
		return rec, Bookmark{}, fmt.Errorf("%w: agent record %s: %w", gym.ErrCheckpointState, key, err)
	}
	return rec, b, nil
}

// CloseAdmission implements gym.Participant: new rollouts are refused and
// every run parks at its next bookmark.
func (p *Participant) CloseAdmission(ctx context.Context, req gym.Request) error {
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate == nil {
		g.gate, g.next = g.next, newGate()
		close(g.gate.park)
		g.changedLocked()
	}
	return nil
}

// OpenAdmission implements gym.Participant: parked runs go on (a paused
// harness continues in place), queued runs may take slots.
func (p *Participant) OpenAdmission(ctx context.Context) error {
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate == nil {
		return nil
	}
	close(g.gate.open)
	g.gate = nil
	// A run parked at this checkpoint is about to continue: it is no longer
	// held, so a prepare that follows at once must wait for it to park
	// again rather than export it while its harness goes on.
	for _, r := range g.runs {
		if r.state == runParked {
			r.state = runWaiting
		}
	}
	g.changedLocked()
	return nil
}

// Ready implements gym.Readier.
func (p *Participant) Ready() bool {
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	for _, r := range p.reg.runs {
		if r.blocks() {
			return false
		}
	}
	return true
}

// Readiness implements gym.Participant: the blockers are the runs between
// bookmarks (in the harness or a verify that may not be replayed) and
// retired runs still stopping; restarts are listed, never blocking. Counts:
// sessions (runs and restored records not yet claimed) and at_boundary
// (those a checkpoint can export now).
func (p *Participant) Readiness() gym.Report {
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	var blockers, restarts []string
	at := 0
	for _, r := range g.runs {
		switch {
		case r.blocks():
			blockers = append(blockers, r.id.CaptureKey())
		case r.restart:
			restarts = append(restarts, r.id.CaptureKey())
		default:
			at++
		}
	}
	slices.Sort(blockers)
	slices.Sort(restarts)
	counts := map[string]int{"sessions": len(g.runs) + len(g.restored), "at_boundary": at + len(g.restored)}
	return gym.NewReport(len(blockers) == 0, blockers, counts, restarts)
}

// StatusExtra implements gym.StatusExtender: "accepting", as Gym's agent.
func (p *Participant) StatusExtra() map[string]any {
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	return map[string]any{"accepting": p.reg.gate == nil && !p.reg.closing}
}

// Export implements gym.Participant: the record of every run a checkpoint
// can take (queued, in a replay step, parked), and of every restored run
// whose attempt has not come back yet (still its latest bookmark), within
// scope.
func (p *Participant) Export(ctx context.Context, scope []gym.EpisodeID) ([]gym.Record, error) {
	inScope := func(id gym.EpisodeID) bool { return scope == nil || slices.Contains(scope, id) }
	g := &p.reg
	g.mu.Lock()
	type item struct {
		id gym.EpisodeID
		b  Bookmark
	}
	var items []item
	for _, r := range g.runs {
		if r.exportable() && inScope(r.id) {
			items = append(items, item{r.id, r.bookmark.Clone()})
		}
	}
	for _, rs := range g.restored {
		if inScope(rs.id) {
			items = append(items, item{rs.id, rs.bookmark.Clone()})
		}
	}
	g.mu.Unlock()
	out := make([]gym.Record, 0, len(items))
	var errs []error
	for _, it := range items {
		rec, err := p.newRecord(it.id, it.b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, rec)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, gym.Refuse(gym.ErrCheckpointState, "%v", err)
	}
	slices.SortFunc(out, func(a, b gym.Record) int { return strings.Compare(a.EpisodeID.CaptureKey(), b.EpisodeID.CaptureKey()) })
	return out, nil
}

// Install implements gym.Participant: every record is validated first (an
// invalid one refuses the whole restore, naming it), then each is kept for
// the attempt after its own, which claims it when its /run comes. Only a
// driver with no run in flight restores: live runs could not claim
// records meant for them.
func (p *Participant) Install(ctx context.Context, records []gym.Record, scope []gym.EpisodeID) error {
	parsed := make([]*restored, 0, len(records))
	var bad []error
	for _, r := range records {
		rec, b, err := ParseAgentRecord(r)
		if err == nil && rec.Session.Adapter != p.adapter {
			err = gym.Refuse(gym.ErrCheckpointState, "agent record %s was written by adapter %q; this driver runs %q", r.EpisodeID.CaptureKey(), rec.Session.Adapter, p.adapter)
		}
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if b.Restart {
			// Nothing of a restart run was saved (Export never writes one):
			// it starts over from its input.
			b = Bookmark{V: BookmarkVersion, Next: StageSeed}
		}
		parsed = append(parsed, &restored{id: r.EpisodeID.Next(), bookmark: b, record: r})
	}
	if len(bad) > 0 {
		return fmt.Errorf("restore refused, nothing installed: %w", errors.Join(bad...))
	}
	g := &p.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.runs) > 0 {
		live := make([]string, 0, len(g.runs))
		for _, r := range g.runs {
			live = append(live, r.id.CaptureKey())
		}
		slices.Sort(live)
		return fmt.Errorf("%w: %w: agent restore requires a driver with no run in flight; %d are: %s", gym.ErrRefused, ErrRunsInFlight, len(live), nameSome(live, maxNamed))
	}
	for _, id := range scope {
		delete(g.restored, id.RolloutID)
	}
	for _, rs := range parsed {
		g.restored[rs.id.RolloutID] = rs
	}
	g.changedLocked()
	return nil
}

// Retire implements gym.Participant: the run of id's rollout, if it is
// that attempt or an earlier one, is cancelled (its launch is killed and
// its session closed, as for any cancelled run) and waited for; a restored
// record of such an attempt is dropped.
func (p *Participant) Retire(ctx context.Context, id gym.EpisodeID) error {
	g := &p.reg
	g.mu.Lock()
	if rs, ok := g.restored[id.RolloutID]; ok && rs.id.Attempt <= id.Attempt {
		delete(g.restored, id.RolloutID)
	}
	r, ok := g.runs[id.RolloutID]
	if ok && r.id.Attempt <= id.Attempt {
		r.retired = true
		if r.cancel != nil {
			r.cancel(fmt.Errorf("%w: %s was retired by the controller", ErrCancelled, r.id.CaptureKey()))
		}
	} else {
		r = nil
	}
	g.changedLocked()
	g.mu.Unlock()
	if r == nil {
		return nil
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("retire %s: its run has not ended yet: %w", r.id.CaptureKey(), ctx.Err())
	}
}

// ParkExported implements gym.Participant: the launches that parks left
// paused for the records are killed (a commit with stop, now durable); the
// runs relaunch on their saved sessions if the checkpoint reopens instead.
func (p *Participant) ParkExported(ctx context.Context, records []gym.Record) error {
	keys := map[string]bool{}
	for _, r := range records {
		keys[r.EpisodeID.CaptureKey()] = true
	}
	g := &p.reg
	g.mu.Lock()
	var stop []*run
	for _, r := range g.runs {
		if r.state == runParked && r.stopper != nil && keys[r.id.CaptureKey()] {
			stop = append(stop, r)
		}
	}
	g.mu.Unlock()
	var errs []error
	for _, r := range stop {
		if err := r.stopper(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop the launch of %s: %w", r.id.CaptureKey(), err))
		}
		g.mu.Lock()
		r.killed = true
		g.mu.Unlock()
	}
	return errors.Join(errs...)
}

// RestoredPending implements gym.RestoredKeeper.
func (p *Participant) RestoredPending(ctx context.Context) ([]gym.EpisodeID, error) {
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	out := make([]gym.EpisodeID, 0, len(p.reg.restored))
	for _, rs := range p.reg.restored {
		out = append(out, rs.id)
	}
	slices.SortFunc(out, func(a, b gym.EpisodeID) int { return strings.Compare(a.CaptureKey(), b.CaptureKey()) })
	return out, nil
}

// DeleteRestored implements gym.RestoredKeeper.
func (p *Participant) DeleteRestored(ctx context.Context, id gym.EpisodeID) error {
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	if rs, ok := p.reg.restored[id.RolloutID]; ok && rs.id == id {
		delete(p.reg.restored, id.RolloutID)
		p.reg.changedLocked()
	}
	return nil
}

var (
	_ gym.Participant    = (*Participant)(nil)
	_ gym.Readier        = (*Participant)(nil)
	_ gym.RestoredKeeper = (*Participant)(nil)
	_ gym.StatusExtender = (*Participant)(nil)
)

// Park closes admission and waits until no run is between bookmarks (every
// harness paused in place or stopped) or the deadline passes, outside any
// checkpoint: a shutdown leaves the runs held at their bookmarks. The
// control plane's phase is not changed.
func (p *Participant) Park(ctx context.Context, deadline time.Time) error {
	if err := p.CloseAdmission(ctx, gym.Request{}); err != nil {
		return err
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := p.WaitFor(ctx, func([]RunInfo) bool { return p.Ready() }); err != nil {
		return fmt.Errorf("park the runs: %d still between bookmarks: %w", p.Readiness().BlockerCount, err)
	}
	return nil
}
