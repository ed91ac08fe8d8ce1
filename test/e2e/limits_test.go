package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
)

// concurrency watches how many runs hold a slot at once, two ways: the
// live harness scripts of the test's rollouts (a harness runs only while
// its run holds a slot), and /metrics ngdriver_runs (runs past the queue
// and not yet at return).
type concurrency struct {
	mu         sync.Mutex
	maxProcs   int
	maxMetrics int
	stop       chan struct{}
	done       chan struct{}
}

func (e *env) watchConcurrency() *concurrency {
	c := &concurrency{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
			}
			n := len(e.liveHarnesses())
			c.mu.Lock()
			c.maxProcs = max(c.maxProcs, n)
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *concurrency) observeMetrics(m metrics) {
	busy := 0.0
	for series, v := range m {
		if !strings.HasPrefix(series, "ngdriver_runs{") || strings.Contains(series, `state="queued"`) || strings.Contains(series, `stage="return"`) {
			continue
		}
		busy += v
	}
	c.mu.Lock()
	c.maxMetrics = max(c.maxMetrics, int(busy))
	c.mu.Unlock()
}

func (c *concurrency) finish() (procs, metrics int) {
	close(c.stop)
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxProcs, c.maxMetrics
}

// liveHarnesses lists the rollouts whose harness script runs now.
func (e *env) liveHarnesses() []string {
	var out []string
	for _, p := range e2eproc.OwnProcesses(e.prefix) {
		if !strings.Contains(p.Cmdline, "fake-harness.sh") || strings.Contains(p.Cmdline, "ngsup") {
			continue
		}
		// .../state/fake/<rollout>-a<N>-<n> names the rollout.
		i := strings.Index(p.Cmdline, "/state/fake/")
		if i < 0 {
			continue
		}
		word := strings.Fields(p.Cmdline[i+len("/state/fake/"):])[0]
		if j := strings.LastIndex(word, "-a"); j > 0 {
			word = word[:j]
		}
		if !slices.Contains(out, word) {
			out = append(out, word)
		}
	}
	return out
}

// TestConcurrencyLimit: with max_runs 2 and 4 runs, at most 2 run at once;
// a prepare while 2 run and 2 wait is ready once the 2 running have parked
// (the queued ones never block it), the commit exports all 4 (the waiting
// ones at next=seed, attempt 0, no launch), and all 4 finish verified
// after the resume.
func TestConcurrencyLimit(t *testing.T) {
	const steps = 10
	e := newEnv(t, options{maxRuns: 2, steps: steps})
	watch := e.watchConcurrency()
	var ids []string
	chans := map[string]<-chan runReply{}
	for i := range 4 {
		id := e.rollout(fmt.Sprintf("r%d", i))
		ids = append(ids, id)
		chans[id] = e.startRun("/run", id, e.body(id, steps, e.opts.stepS))
	}
	// Two take a step; two wait in the queue.
	var running, queued []string
	testkit.Eventually(t, "2 runs stepping and 2 queued", func() (bool, string) {
		m := e.scrape()
		watch.observeMetrics(m)
		q, _ := m.sum("ngdriver_runs", `state="queued"`)
		running = running[:0]
		for _, id := range ids {
			if len(e2eproc.SessionSteps(e.base, id)) > 0 {
				running = append(running, id)
			}
		}
		return q == 2 && len(running) == 2, fmt.Sprintf("%v queued, stepping %v", q, running)
	})
	for _, id := range ids {
		if !slices.Contains(running, id) {
			queued = append(queued, id)
		}
	}
	ck := e.prepareCommit(e.prefix + "-ck1")
	if len(ck.records) != 4 {
		t.Fatalf("the commit wrote %d records, want all 4: %v", len(ck.records), ck.com.EpisodeIDs)
	}
	for id, r := range ck.records {
		b := r.bookmark(t)
		switch {
		case slices.Contains(queued, id):
			if b.Next != "seed" || r.ID.Attempt != 0 || b.Paused != nil || len(b.Launches) != 0 {
				t.Errorf("queued %s exported as %s (attempt %d), want next=seed attempt 0, no launch", id, r.Bookmark, r.ID.Attempt)
			}
		case !ck.paused[id]:
			t.Errorf("running %s was not exported paused: %s", id, r.Bookmark)
		}
	}
	// While the checkpoint holds, the queued runs take no slot.
	time.Sleep(300 * time.Millisecond)
	for _, id := range queued {
		if n := len(e2eproc.SessionSteps(e.base, id)); n != 0 {
			t.Errorf("queued %s took %d steps during the checkpoint", id, n)
		}
	}
	watch.observeMetrics(e.scrape())
	e.resumeAll(ck.id)
	// Watch /metrics until all have returned.
	doneCh := make(chan struct{})
	go func() {
		defer close(doneCh)
		for {
			select {
			case <-watch.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if m, ok := scrapeQuiet(e.ctl.url); ok {
				watch.observeMetrics(m)
			}
		}
	}()
	for _, id := range ids {
		res := await(t, chans[id]).result(t)
		pauses := 1
		if slices.Contains(queued, id) {
			pauses = 0
		}
		checkOneLaunch(t, e, id, res, steps, pauses)
	}
	procs, byMetrics := watch.finish()
	<-doneCh
	t.Logf("at most %d harnesses ran at once (%d runs in flight by /metrics)", procs, byMetrics)
	if procs > 2 || byMetrics > 2 {
		t.Errorf("max_runs 2, yet %d harnesses ran at once (%d runs in flight by /metrics)", procs, byMetrics)
	}
	if procs < 2 {
		t.Errorf("never saw 2 harnesses at once (%d): the watch saw nothing", procs)
	}
}
