package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/gym"
)

// flow is what runCheckpointFlow did: the runs, how many checkpoints paused
// each, and their results.
type flow struct {
	ids         []string
	pauses      map[string]int
	results     map[string]result
	checkpoints []checkpoint
}

// runCheckpointFlow starts n runs of the fake adapter at once, waits until
// each has taken a step, then runs two checkpoints (prepareCommit, then
// resumeAll) and collects every result, checking
// each run finished verified with one launch paused once per checkpoint it
// was parked in.
func runCheckpointFlow(t *testing.T, e *env, n, steps int) flow {
	f := flow{pauses: map[string]int{}, results: map[string]result{}}
	chans := map[string]<-chan runReply{}
	for i := range n {
		id := e.rollout(fmt.Sprintf("r%d", i))
		f.ids = append(f.ids, id)
		chans[id] = e.startRun("/run", id, e.body(id, steps, e.opts.stepS))
	}
	e.waitStepped(f.ids...)
	for k := 1; k <= 2; k++ {
		ck := e.prepareCommit(fmt.Sprintf("%s-ck%d", e.prefix, k))
		f.checkpoints = append(f.checkpoints, ck)
		t.Logf("checkpoint %d: %d runs exported, %d paused in place", k, len(ck.records), len(ck.paused))
		if k == 1 && len(ck.paused) == 0 {
			t.Fatalf("checkpoint 1 paused no run, though every run had taken a step: %+v", ck.com)
		}
		before := map[string]int{}
		for id, r := range ck.records {
			if !ck.paused[id] {
				continue
			}
			f.pauses[id]++
			b := r.bookmark(t)
			last := b.Launches[len(b.Launches)-1]
			if r.ID.Attempt != 0 || !b.Resume || last.Pauses != f.pauses[id] || last.ID != driver.LaunchID(id, 0, 1, last.SandboxID) {
				t.Errorf("checkpoint %d: the record of paused %s: attempt %d, resume %v, last launch %+v; want attempt 0, resume and pauses %d",
					k, id, r.ID.Attempt, b.Resume, last, f.pauses[id])
			}
			before[id] = len(e2eproc.SessionSteps(e.base, id))
		}
		// A paused harness holds still: no step while the checkpoint is
		// committed (two steps' time).
		time.Sleep(time.Duration(2*e.opts.stepS*float64(time.Second)) + 100*time.Millisecond)
		for id, nb := range before {
			if na := len(e2eproc.SessionSteps(e.base, id)); na != nb {
				t.Errorf("checkpoint %d: %s took steps while paused (%d, then %d)", k, id, nb, na)
			}
		}
		e.resumeAll(ck.id)
		// The same processes go on: each paused run takes another step.
		testkit.Eventually(t, "every paused run goes on after the resume", func() (bool, string) {
			for id, nb := range before {
				if na := len(e2eproc.SessionSteps(e.base, id)); na <= nb && na < steps {
					return false, fmt.Sprintf("%s still at %d steps", id, na)
				}
			}
			return true, ""
		})
	}
	for _, id := range f.ids {
		res := await(t, chans[id]).result(t)
		f.results[id] = res
		checkOneLaunch(t, e, id, res, steps, f.pauses[id])
	}
	return f
}

// checkOneLaunch checks a run (attempt 0) that was never relaunched:
// verified, one launch that finished after pauses pauses, every step taken
// once.
func checkOneLaunch(t *testing.T, e *env, id string, res result, steps, pauses int) {
	t.Helper()
	if res.Reward != 1 || res.FailureKind != "" || res.RolloutID != id {
		t.Errorf("%s: reward %v failure %q %q (_ng_rollout_id %q), want reward 1", id, res.Reward, res.FailureKind, res.FailureReason, res.RolloutID)
	}
	if len(res.Launches) != 1 {
		t.Errorf("%s: %d launches, want 1: %+v", id, len(res.Launches), res.Launches)
		return
	}
	l := res.Launches[0]
	if l.ID != driver.LaunchID(id, 0, 1, l.SandboxID) || l.Outcome != "finished" || l.ExitCode != 0 || l.Resumed || l.Reason != "first launch" || !l.Supervised || l.Pauses != pauses {
		t.Errorf("%s: launch %+v, want %s finished, supervised, first launch, pauses %d", id, l, driver.LaunchID(id, 0, 1, l.SandboxID), pauses)
	}
	if res.Fake.Steps != steps || res.Fake.FirstStep != 1 {
		t.Errorf("%s: harness output %+v, want %d steps from step 1", id, res.Response, steps)
	}
	if got := e2eproc.SessionSteps(e.base, id); !slices.Equal(got, fake.StepLines(1, steps)) {
		t.Errorf("%s: the session's steps are %q, want each of 1..%d once", id, got, steps)
	}
}

// TestCheckpointedRuns: eight runs at once go through two checkpoints
// (prepare, commit, resume on the driver and the owner) and each finishes
// verified with its one launch paused in place once per checkpoint that
// parked it, no step lost or repeated; every commit published its records
// as Gym's store does (manifest.json last, naming records-<sha256>.jsonl
// of driver.AgentRecords under gym/agent/<name>, of lending.Records
// with a snapshot of each paused run's sandbox under
// gym/resources/ngdriver_owner). Then Gym's retire and forget, on both
// participants: a retired attempt is refused with 409 stale_attempt by
// the driver's /run and the owner's seed (and both statuses count the
// mark) until its rollout is forgotten on both, when it runs again.
func TestCheckpointedRuns(t *testing.T) {
	e := newEnv(t, options{steps: 12})
	f := runCheckpointFlow(t, e, 8, 12)
	total := 0
	for _, n := range f.pauses {
		total += n
	}
	t.Logf("%d runs, %d pauses in all", len(f.ids), total)
	if h := e.health(); h.Phase != "idle" || h.Runs != 0 || !h.OK {
		t.Errorf("/healthz after the runs: %+v, want ok, idle, no runs", h)
	}
	// Retire a finished rollout on both participants: its attempt is
	// refused until forgotten on both.
	gone := f.ids[0]
	retire := map[string]any{"checkpoint_id": e.prefix + "-retire", "deadline_ts": deadline(waitLimit), "episode_ids": episodes(gone)}
	for _, c := range []*controller{e.ctl, e.own} {
		var ret gym.RetireReply
		c.must(t, "retire", retire, &ret)
		if !slices.Equal(ret.Retired, []string{gone}) {
			t.Errorf("%s retire %s answered %+v", c.name, gone, ret)
		}
		if s := c.status(t); s.RetiredRollouts != 1 || s.Phase != gym.PhaseIdle {
			t.Errorf("%s status after the retire: %+v, want 1 retired rollout, idle", c.name, s)
		}
	}
	r := postRun(t.Context(), e.ctl.url, "/run", gone, e.body(gone, 2, 0.05))
	wantRefused(t, ctlReply{call: "run " + gone, status: r.status, body: r.body}, http.StatusConflict, gym.CodeStaleAttempt, gone)
	// Forgotten on the driver alone, the run is admitted, and the owner
	// still refuses its seed as stale.
	forget := map[string]any{"checkpoint_id": e.prefix + "-retire", "deadline_ts": deadline(waitLimit), "rollout_ids": []string{gone}}
	var fg gym.ForgetReply
	e.ctl.must(t, "forget", forget, &fg)
	if !slices.Equal(fg.Forgotten, []string{gone}) || e.ctl.status(t).RetiredRollouts != 0 {
		t.Errorf("driver forget %s answered %+v", gone, fg)
	}
	if r := postRun(t.Context(), e.ctl.url, "/run", gone, e.body(gone, 2, 0.05)); r.err != nil || !strings.Contains(string(r.body), gym.CodeStaleAttempt) {
		t.Errorf("%s forgotten on the driver only: %s, want the owner's %s", gone, r, gym.CodeStaleAttempt)
	} else {
		t.Logf("%s forgotten on the driver only: %s", gone, r)
	}
	var ofg gym.ForgetReply
	e.own.must(t, "forget", forget, &ofg)
	if !slices.Equal(ofg.Forgotten, []string{gone}) || e.own.status(t).RetiredRollouts != 0 {
		t.Errorf("owner forget %s answered %+v", gone, ofg)
	}
	if res := postRun(t.Context(), e.ctl.url, "/run", gone, e.body(gone, 2, 0.05)).result(t); res.Reward != 1 {
		t.Errorf("%s after the forgets: %+v, want reward 1", gone, res)
	}
	e.wantPhase(t, "idle")
}

// TestCommitStop: a commit with stop (Gym's "the controller stops after
// this checkpoint") kills the launches the prepare left paused, once the
// records are durable; the runs stay parked, and after the resume each
// relaunches on its saved session in the same sandbox and finishes with
// every step taken once. The owner is prepared and committed into the
// same folder as the driver, without stop: its stop removes the exported
// sandboxes (a restore forks them again), and this test resumes in place.
func TestCommitStop(t *testing.T) {
	const steps = 12
	e := newEnv(t, options{steps: steps})
	var ids []string
	chans := map[string]<-chan runReply{}
	for i := range 2 {
		id := e.rollout(fmt.Sprintf("r%d", i))
		ids = append(ids, id)
		chans[id] = e.startRun("/run", id, e.body(id, steps, e.opts.stepS))
	}
	e.waitStepped(ids...)
	id := e.prefix + "-ck1"
	var prep prepared
	e.ctl.must(t, "prepare", plainBody(id), &prep)
	if prep.Phase != gym.PhasePrepared {
		t.Fatalf("prepare answered %+v", prep)
	}
	e.prepareOwner(id)
	dir := filepath.Join(e.dir, "checkpoints", id)
	var com committed
	e.ctl.must(t, "commit", commitBody(id, dir, nil, true), &com)
	records := checkCommitted(t, dir, id, com)
	if want := []string{ids[0], ids[1]}; !slices.Equal(com.EpisodeIDs, want) || com.Manifest.RecordCount != 2 {
		t.Errorf("commit with stop answered %+v, want the records of %v", com, want)
	}
	// Killed at once: nothing of the launches runs, and the runs did not
	// return.
	if left := e.leftovers(); len(left) != 0 {
		t.Errorf("after the commit with stop, processes of the launches are left: %v", left)
	}
	done := map[string]int{}
	for rollout, r := range records {
		b := r.bookmark(t)
		if b.Paused == nil {
			t.Fatalf("%s was not exported paused: %s", rollout, r.Bookmark)
		}
		done[rollout] = len(e2eproc.SessionSteps(e.base, rollout))
	}
	ownCom, owned := e.commitOwner(id, dir, nil, false)
	if !slices.Equal(ownCom.EpisodeIDs, com.EpisodeIDs) || len(owned) != 2 {
		t.Errorf("the owner's commit answered %+v, want the sessions of %v", ownCom, com.EpisodeIDs)
	}
	for _, id := range ids {
		select {
		case r := <-chans[id]:
			t.Fatalf("run %s returned during the checkpoint: %s", id, r)
		default:
		}
	}
	e.resumeAll(id)
	for _, id := range ids {
		res := await(t, chans[id]).result(t)
		if res.Reward != 1 || len(res.Launches) != 2 {
			t.Errorf("%s: reward %v, %d launches, want 1 and 2: %+v", id, res.Reward, len(res.Launches), res.Launches)
			continue
		}
		first, second := res.Launches[0], res.Launches[1]
		if first.ID != driver.LaunchID(id, 0, 1, first.SandboxID) || first.Outcome != "interrupted" || first.Pauses != 1 || !strings.Contains(first.Error, "stopped at a checkpoint commit") {
			t.Errorf("%s: first launch %+v, want interrupted after 1 pause, stopped by the commit", id, first)
		}
		reason := fmt.Sprintf("the saved session holds %d completed steps", done[id])
		if second.ID != driver.LaunchID(id, 0, 2, first.SandboxID) || !second.Resumed || second.Reason != reason || second.Outcome != "finished" || second.SandboxID != first.SandboxID {
			t.Errorf("%s: relaunch %+v, want %s resumed (%q) in the same sandbox", id, second, driver.LaunchID(id, 0, 2, first.SandboxID), reason)
		}
		if res.Fake.FirstStep != done[id]+1 || res.Fake.Steps != steps {
			t.Errorf("%s: harness output %+v, want steps %d..%d by the relaunch", id, res.Response, done[id]+1, steps)
		}
		if got := e2eproc.SessionSteps(e.base, id); !slices.Equal(got, fake.StepLines(1, steps)) {
			t.Errorf("%s: the session's steps are %q, want each of 1..%d once", id, got, steps)
		}
	}
}

// metrics is a scrape of /metrics: series (name{labels}) -> value.
type metrics map[string]float64

func (e *env) scrape() metrics {
	e.t.Helper()
	m, err := scrapeURL(e.ctl.url)
	if err != nil {
		e.t.Fatalf("GET /metrics: %v", err)
	}
	return m
}

// scrapeQuiet scrapes without failing the test (for a watching goroutine).
func scrapeQuiet(url string) (metrics, bool) {
	m, err := scrapeURL(url)
	return m, err == nil
}

func scrapeURL(url string) (metrics, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		return nil, fmt.Errorf("HTTP %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	m := metrics{}
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("a line without a value: %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", line, err)
		}
		m[line[:i]] = v
	}
	return m, nil
}

// sum adds the series of name whose labels include every one of labels
// (each `key="value"`); found says whether there was one.
func (m metrics) sum(name string, labels ...string) (total float64, found bool) {
	for series, v := range m {
		n, lbl, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(lbl, l) {
				ok = false
			}
		}
		if ok {
			total += v
			found = true
		}
	}
	return total, found
}

// TestMetrics: after the checkpointed flow, /metrics holds the pauses,
// the finished launches, the pause and continue latency histograms with
// their counts, one observation per checkpoint phase call, and no run left;
// /healthz answers.
func TestMetrics(t *testing.T) {
	e := newEnv(t, options{steps: 12})
	f := runCheckpointFlow(t, e, 3, 12)
	pauses := 0
	for _, n := range f.pauses {
		pauses += n
	}
	m := e.scrape()
	want := func(name string, cond func(float64) bool, what string, labels ...string) {
		t.Helper()
		v, ok := m.sum(name, labels...)
		if !ok || !cond(v) {
			t.Errorf("/metrics: %s%v = %v (present %v), want %s", name, labels, v, ok, what)
		}
	}
	eq := func(n float64) func(float64) bool { return func(v float64) bool { return v == n } }
	ge := func(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }
	want("ngdriver_pauses_total", eq(float64(pauses)), fmt.Sprintf("the %d pauses the runs report", pauses))
	want("ngdriver_pauses_total", ge(1), ">= 1")
	want("ngdriver_launches_total", eq(3), "3", `outcome="finished"`)
	want("ngdriver_pause_seconds_count", ge(float64(pauses)), fmt.Sprintf(">= %d", pauses))
	want("ngdriver_pause_seconds_bucket", ge(float64(pauses)), "the +Inf bucket counting every pause", `le="+Inf"`)
	want("ngdriver_pause_seconds_sum", ge(0), "present")
	want("ngdriver_continue_seconds_count", eq(float64(pauses)), fmt.Sprintf("one continue per pause (%d)", pauses))
	want("ngdriver_continue_seconds_sum", ge(0), "present")
	for _, phase := range []string{"prepare", "commit", "resume"} {
		want("ngdriver_checkpoint_phase_seconds_count", eq(2), "2 (two checkpoints)", `phase="`+phase+`"`)
		want("ngdriver_checkpoint_phase_seconds_bucket", eq(2), "2 in the +Inf bucket", `phase="`+phase+`"`, `le="+Inf"`)
	}
	want("ngdriver_http_requests_total", eq(3), "3 runs answered 200", `route="run"`, `code="200"`)
	if v, _ := m.sum("ngdriver_runs"); v != 0 {
		t.Errorf("/metrics: ngdriver_runs sums to %v after every run returned", v)
	}
	if v, _ := m.sum("ngdriver_failed_pauses_total"); v != 0 {
		t.Errorf("/metrics: %v failed pauses", v)
	}
	if h := e.health(); !h.OK || h.Phase != "idle" || h.Runs != 0 {
		t.Errorf("/healthz: %+v, want ok, idle, no runs", h)
	}
}
