package gym

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
)

// Ports test_random_sequences_keep_checkpoints_safe
// (test_checkpoint_sequences.py), for one process: seeded random sequences
// of prepare, commit (with writes held past their deadline or failing),
// resume, retire, forget and restore, with Gym's invariants checked after
// every step:
//   - admission is open whenever the participant is idle;
//   - every manifest on disk verifies, and is the one its commit returned;
//   - what a checkpoint stores is its first export, even after retries;
//   - once resume returns, no manifest appears for a checkpoint that had none;
//   - a commit never includes an attempt retired before it;
//   - every committed checkpoint restores into a fresh participant.
func TestRandomSequencesKeepCheckpointsSafe(t *testing.T) {
	for seed := range 40 {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { newSimulation(t, uint64(seed)).run() })
	}
}

type simulation struct {
	t         *testing.T
	rng       *rand.Rand
	dir       string
	f         *fake
	c         *Control
	gate      *writeGate
	next      int // rollouts started
	count     int // checkpoint ids used
	exporting string
	first     map[string][]Record
	committed map[string]*CommitReply
	retired   map[string]bool // capture keys refused before a commit
	resumed   map[string]bool // resumed with no manifest on disk
	log       []string
}

// writeGate holds or fails writes just before they publish, as the
// sequences test's GatedWrites does: held unless passing is set.
type writeGate struct {
	mu       sync.Mutex
	cond     *sync.Cond
	passing  bool
	running  int
	failNext bool
}

func newWriteGate() *writeGate {
	g := &writeGate{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *writeGate) hook() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failNext {
		g.failNext = false
		return errors.New("disk full")
	}
	g.running++
	for !g.passing {
		g.cond.Wait()
	}
	g.running--
	return nil
}

func (g *writeGate) setPassing(passing bool) {
	g.mu.Lock()
	g.passing = passing
	g.cond.Broadcast()
	g.mu.Unlock()
}

// drain lets every held write go on, waits until none is held, and holds
// new ones again.
func (g *writeGate) drain(t *testing.T) {
	g.setPassing(true)
	testkit.Eventually(t, "held writes finish", func() (bool, string) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.running == 0, ""
	})
	g.setPassing(false)
}

func newSimulation(t *testing.T, seed uint64) *simulation {
	f, c := newFake(t, time.Minute)
	c.logf = func(string, ...any) {}
	s := &simulation{
		t: t, rng: rand.New(rand.NewPCG(seed, 1)), dir: t.TempDir(), f: f, c: c,
		gate:  newWriteGate(),
		first: map[string][]Record{}, committed: map[string]*CommitReply{},
		retired: map[string]bool{}, resumed: map[string]bool{},
	}
	hook := s.gate.hook
	beforePublish.Store(&hook)
	t.Cleanup(func() {
		s.gate.drain(t)
		beforePublish.Store(nil)
	})
	f.onExport = func(records []Record) {
		if _, ok := s.first[s.exporting]; !ok {
			s.first[s.exporting] = slices.Clone(records)
		}
	}
	return s
}

func (s *simulation) run() {
	ops := []struct {
		name   string
		weight int
		do     func()
	}{
		{"start", 3, s.start}, {"advance", 4, s.advance}, {"block", 2, s.block},
		{"prepare", 3, s.prepare}, {"commit", 3, s.commit}, {"resume", 3, s.resume},
		{"retire", 2, s.retire}, {"forget", 1, s.forget}, {"fail_next_write", 1, s.failNextWrite},
		{"drain", 1, func() { s.gate.drain(s.t) }}, {"restore", 1, s.restore},
	}
	total := 0
	for _, op := range ops {
		total += op.weight
	}
	for range 40 {
		n := s.rng.IntN(total)
		for _, op := range ops {
			if n -= op.weight; n < 0 {
				s.log = append(s.log, op.name)
				op.do()
				break
			}
		}
		s.check()
	}
	if s.c.Status().CheckpointID != nil {
		s.resume()
	}
	s.gate.drain(s.t)
	s.check()
	for id := range s.committed {
		s.restoreInto(id)
	}
}

func (s *simulation) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("after %v: %s", s.log, fmt.Sprintf(format, args...))
}

func (s *simulation) start() {
	s.f.mu.Lock()
	s.f.records = append(s.f.records, rec(s.t, fmt.Sprintf("r%d", s.next), 0, 0))
	s.f.mu.Unlock()
	s.next++
}

func (s *simulation) advance() {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if len(s.f.records) > 0 {
		i := s.rng.IntN(len(s.f.records))
		id := s.f.records[i].EpisodeID
		s.f.records[i] = rec(s.t, id.RolloutID, id.Attempt, s.rng.IntN(100))
	}
}

func (s *simulation) block() {
	if s.rng.IntN(2) == 0 {
		s.f.setBlockers()
	} else {
		s.f.setBlockers("straggler")
	}
}

func (s *simulation) current() string {
	if id := s.c.Status().CheckpointID; id != nil {
		return *id
	}
	s.count++
	return fmt.Sprintf("c%d", s.count)
}

func (s *simulation) prepare() {
	secs := 5.0
	if !s.f.Readiness().Ready {
		secs = 0.01
	}
	s.c.Prepare(bg, in(s.current(), secs))
}

func (s *simulation) commit() {
	if s.c.Status().Phase != PhasePrepared && s.rng.IntN(5) != 0 {
		// Usually as a controller does, after a prepare that the runs park
		// for; sometimes without one, which must be refused.
		s.f.setBlockers()
		s.prepare()
	}
	id := s.current()
	s.exporting = id
	req := &CommitRequest{Request: in(id, 5), CheckpointDir: filepath.Join(s.dir, id)}
	if s.rng.IntN(2) == 0 {
		for k := range s.next {
			if s.rng.IntN(2) == 0 {
				req.EpisodeIDs = append(req.EpisodeIDs, EpisodeID{fmt.Sprintf("r%d", k), 0})
			}
		}
		if req.EpisodeIDs == nil {
			req.EpisodeIDs = []EpisodeID{}
		}
	}
	retiredBefore := maps(s.retired)
	held := s.rng.IntN(2) == 0
	if held {
		// The write waits at the gate past the commit's deadline and goes on.
		req.DeadlineTS = nowSeconds() + 0.02
	} else {
		s.gate.setPassing(true)
	}
	reply, err := s.c.Commit(bg, req)
	if !held {
		s.gate.drain(s.t)
	}
	if err != nil {
		return
	}
	for _, key := range reply.EpisodeIDs {
		if retiredBefore[key] {
			s.fatalf("commit %s included the retired attempt %s", id, key)
		}
	}
	if prev, ok := s.committed[id]; ok && fmtJSON(s.t, prev.Manifest) != fmtJSON(s.t, reply.Manifest) {
		s.fatalf("a retried commit of %s changed its manifest", id)
	}
	s.committed[id] = reply
}

func maps(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (s *simulation) resume() {
	id := s.current()
	reply, err := s.c.Resume(bg, in(id, 5))
	if err == nil && !reply.Idempotent {
		if _, err := os.Stat(s.manifestPath(id)); err != nil {
			s.resumed[id] = true
		}
	}
}

func (s *simulation) retire() {
	if s.next == 0 {
		return
	}
	id := EpisodeID{fmt.Sprintf("r%d", s.rng.IntN(s.next)), 0}
	s.c.Retire(bg, &RetireRequest{Request: in(fmt.Sprintf("retire-%d", len(s.log)), 5), EpisodeIDs: []EpisodeID{id}})
	if s.c.CheckAttempt(id) != nil {
		s.retired[id.CaptureKey()] = true
	}
}

func (s *simulation) forget() {
	for key := range s.retired {
		if _, err := s.c.Forget(bg, &ForgetRequest{Request: in(fmt.Sprintf("forget-%d", len(s.log)), 5), RolloutIDs: []string{key}}); err == nil {
			delete(s.retired, key)
		}
		return
	}
}

func (s *simulation) failNextWrite() {
	s.gate.mu.Lock()
	s.gate.failNext = true
	s.gate.mu.Unlock()
}

func (s *simulation) restore() {
	for id := range s.committed {
		s.restoreInto(id)
		return
	}
}

// restoreInto restores a committed checkpoint into a fresh participant,
// which must install exactly what was committed, under attempt + 1.
func (s *simulation) restoreInto(id string) {
	s.t.Helper()
	committed := s.committed[id]
	var scope []EpisodeID
	var want []string
	for _, key := range committed.EpisodeIDs {
		e := must(ParseCaptureKey(key))
		scope = append(scope, e)
		want = append(want, e.Next().CaptureKey())
	}
	fresh, c := newFake(s.t, time.Minute)
	rid := fmt.Sprintf("restore-%d", len(s.log))
	reply, err := c.Restore(bg, &RestoreRequest{Request: in(rid, 5), CheckpointDir: filepath.Join(s.dir, id), EpisodeIDs: scope})
	if err != nil {
		s.fatalf("committed checkpoint %s does not restore: %v", id, err)
	}
	slices.Sort(want)
	if !slices.Equal(reply.Restored, want) && !(len(want) == 0 && len(reply.Restored) == 0) {
		s.fatalf("restore of %s installed %v, want %v", id, reply.Restored, want)
	}
	must(c.Resume(bg, in(rid, 5)))
	if !fresh.isOpen() {
		s.fatalf("admission closed after a restore resumed")
	}
}

func (s *simulation) manifestPath(id string) string {
	return filepath.Join(s.dir, id, "gym", "agent", "inst", ManifestName)
}

func (s *simulation) check() {
	s.t.Helper()
	if s.c.Status().Phase == PhaseIdle && !s.f.isOpen() {
		s.fatalf("admission closed while idle")
	}
	for n := 1; n <= s.count; n++ {
		id := fmt.Sprintf("c%d", n)
		if _, err := os.Stat(s.manifestPath(id)); err != nil {
			continue
		}
		if s.resumed[id] {
			s.fatalf("resumed checkpoint %s published a manifest", id)
		}
		var stored []Record
		m, err := ReadState(filepath.Join(s.dir, id), "agent", "inst", func(r Record) error { stored = append(stored, r); return nil })
		if err != nil {
			s.fatalf("manifest of %s does not verify: %v", id, err)
		}
		if reply, ok := s.committed[id]; ok && fmtJSON(s.t, reply.Manifest) != fmtJSON(s.t, m) {
			s.fatalf("the manifest of %s on disk is not the one committed", id)
		}
		if fmtJSON(s.t, recordLines(stored)) != fmtJSON(s.t, recordLines(s.first[id])) {
			s.fatalf("checkpoint %s stored a later export", id)
		}
	}
}

func recordLines(records []Record) []string {
	lines := make([]string, len(records))
	for i, r := range records {
		lines[i] = string(r.JSON)
	}
	return lines
}
