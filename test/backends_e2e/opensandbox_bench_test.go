package backends_e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/gym"
)

// TestOpenSandboxPrepareFigures prints what a checkpoint of N launches in
// N OpenSandbox sandboxes costs over the fake OpenSandbox at real execd's
// timing (NGHARNESS_BENCH_OSB=1; N from NGHARNESS_BENCH_OSB_N, default 8):
// N rollouts of the fake harness under one driver, then 3 checkpoints,
// each timed in its phases (prepare: every launch paused through the
// backend, then the owner's prepare; commit: the owner snapshots the N
// sandboxes; resume: every launch continued), with the execs each
// sandbox got during the prepare. The figures are in docs/BENCHMARKS.md.
func TestOpenSandboxPrepareFigures(t *testing.T) {
	if os.Getenv("NGHARNESS_BENCH_OSB") != "1" {
		t.Skip("NGHARNESS_BENCH_OSB=1 prints the OpenSandbox prepare figures")
	}
	n := 8
	if v := os.Getenv("NGHARNESS_BENCH_OSB_N"); v != "" {
		fmt.Sscan(v, &n)
	}
	w := newWorld(t, "opensandbox")
	p := newParticipant()
	rn := w.runner(p, nil)
	var ros, sbs []string
	for i := range n {
		ro := w.rollout(fmt.Sprintf("bench%d", i))
		w.start(rn, ro, 1, task(ro, "count", 400, 0.25))
		ros = append(ros, ro)
	}
	for _, ro := range ros {
		sb := w.session(ro).SandboxID
		waitSteps(t, w.sessionDir(sb, ro), 2)
		sbs = append(sbs, sb)
	}
	ctx := context.Background()
	parts := w.controls(p)
	var prep, commit, resume []time.Duration
	var execs []int
	verbs := map[string]int{}
	verb := regexp.MustCompile(`ngsup-[0-9a-f]+ ([a-z]+)`)
	argv0 := regexp.MustCompile(`&& exec ([^ ']+)`)
	for k := range 3 {
		id := fmt.Sprintf("bench-ckpt-%d", k)
		req := gym.Request{CheckpointID: id, DeadlineTS: float64(time.Now().Add(2*time.Minute).UnixNano()) / 1e9}
		before := map[string]int{}
		for _, sb := range sbs {
			before[sb] = len(w.osb.Commands(sb))
		}
		t0 := time.Now()
		for _, c := range parts {
			rep, err := c.Prepare(ctx, req)
			if err != nil || rep.Phase != gym.PhasePrepared {
				t.Fatalf("prepare %s: %+v %v", id, rep, err)
			}
		}
		prep = append(prep, time.Since(t0))
		for _, sb := range sbs {
			cmds := w.osb.Commands(sb)
			execs = append(execs, len(cmds)-before[sb])
			for _, c := range cmds[before[sb]:] {
				if m := verb.FindStringSubmatch(c); m != nil {
					verbs["ngsup "+m[1]]++
				} else if m := argv0.FindStringSubmatch(c); m != nil {
					verbs[m[1]]++
				} else if strings.Contains(c, `: >"$t.cancel"`) {
					verbs["KillScript"]++
				}
			}
		}
		t0 = time.Now()
		for _, c := range parts {
			if _, err := c.Commit(ctx, &gym.CommitRequest{Request: req, CheckpointDir: filepath.Join(t.TempDir(), id)}); err != nil {
				t.Fatalf("commit %s: %v", id, err)
			}
		}
		commit = append(commit, time.Since(t0))
		t0 = time.Now()
		for _, c := range parts {
			if _, err := c.Resume(ctx, req); err != nil {
				t.Fatalf("resume %s: %v", id, err)
			}
		}
		resume = append(resume, time.Since(t0))
		time.Sleep(time.Second)
	}
	sort.Ints(execs)
	t.Logf("N=%d launches in %d OpenSandbox sandboxes (fake, real execd timing), 3 checkpoints:", n, len(sbs))
	t.Logf("prepare %s", durs(prep))
	t.Logf("commit  %s", durs(commit))
	t.Logf("resume  %s", durs(resume))
	t.Logf("execs per sandbox during a prepare: min %d, median %d, max %d (what they ran, all sandboxes and checkpoints: %v)", execs[0], execs[len(execs)/2], execs[len(execs)-1], verbs)
}

// durs lists durations with their median.
func durs(d []time.Duration) string {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var words []string
	for _, x := range d {
		words = append(words, fmt.Sprintf("%.0f ms", float64(x)/1e6))
	}
	return fmt.Sprintf("median %.0f ms (each: %s)", float64(s[len(s)/2])/1e6, strings.Join(words, ", "))
}
