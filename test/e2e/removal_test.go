package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
)

// recordedProcs waits until the fake harness of a rollout has recorded
// every process it starts (the harness, its child, one in a session of its
// own, a double-forked daemon, one without the launch's tag) and returns
// them with their start times, and the sandbox they run in.
func (e *env) recordedProcs(rollout string) (string, []e2eproc.Info) {
	e.t.Helper()
	var sandbox string
	var procs []e2eproc.Info
	testkit.Eventually(e.t, "the harness of "+rollout+" recorded its processes", func() (bool, string) {
		files, _ := filepath.Glob(filepath.Join(e.base, "sandboxes", "*", ".ngharness", "state", "fake", rollout+"-a*", "pids"))
		if len(files) != 1 {
			return false, fmt.Sprintf("pids files %v", files)
		}
		data, _ := os.ReadFile(files[0])
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) < 5 {
			return false, fmt.Sprintf("%d recorded", len(lines))
		}
		procs = procs[:0]
		for _, l := range lines {
			_, pid, _ := strings.Cut(l, " ")
			n, err := strconv.Atoi(pid)
			if err != nil {
				return false, l
			}
			if p, ok := e2eproc.ReadProc(n); ok {
				procs = append(procs, p)
			}
		}
		rel, _ := filepath.Rel(filepath.Join(e.base, "sandboxes"), files[0])
		sandbox, _, _ = strings.Cut(rel, "/")
		return true, ""
	})
	return sandbox, procs
}

// TestFinishedSandboxesAreRemovedByDefault: `ngdriver owner serve` with its
// default flags removes a session's sandbox when the session ends with a
// verdict, whatever the reward (a check that passes, one that fails),
// after ending every process the harness left in it (the daemon too); it
// keeps the sandbox of a session closed without a verdict (the client went
// away, so the run was cancelled), for inspection, its processes ended as
// well. With --keep-sandboxes a verified session's sandbox stays.
func TestFinishedSandboxesAreRemovedByDefault(t *testing.T) {
	const steps = 4
	e := newEnv(t, options{steps: steps, stepS: 0.2, removeSandboxes: true})
	sandboxGone := func(sb string) bool {
		_, err := os.Stat(filepath.Join(e.base, "sandboxes", sb))
		return os.IsNotExist(err)
	}
	alive := func(procs []e2eproc.Info) []string {
		var out []string
		for _, p := range procs {
			if p.Alive() {
				out = append(out, p.String())
			}
		}
		return out
	}
	for _, c := range []struct {
		name, check string
		reward      float64
	}{{"pass", "", 1}, {"fail", "exit 3", 0}} {
		id := e.rollout(c.name)
		body := e.body(id, steps, e.opts.stepS)
		if c.check != "" {
			body["check"] = c.check
		}
		ch := e.startRun("/run", id, body)
		sb, procs := e.recordedProcs(id)
		res := await(t, ch).result(t)
		if res.Reward != c.reward || len(res.Launches) != 1 || res.Launches[0].SandboxID != sb {
			t.Errorf("%s: %+v, want reward %v from one launch in %s", c.name, res, c.reward, sb)
		}
		if !sandboxGone(sb) {
			t.Errorf("%s: the sandbox %s of a verified session is still there", c.name, sb)
		}
		if left := alive(procs); len(left) > 0 {
			t.Errorf("%s: processes of the removed sandbox still run: %v", c.name, left)
		}
	}

	id := e.rollout("gone")
	ctx, cancel := context.WithCancel(t.Context())
	ch := make(chan runReply, 1)
	go func() { ch <- postRun(ctx, e.ctl.url, "/run", id, e.body(id, 100, 0.3)) }()
	sb, procs := e.recordedProcs(id)
	cancel()
	if r := <-ch; r.err == nil {
		t.Fatalf("the cancelled request got a reply: %s", r)
	}
	testkit.Eventually(t, "the cancelled run's session is closed and its processes ended", func() (bool, string) {
		s := e.own.status(t)
		left := alive(procs)
		return s.Report.Counts["sessions"] == 0 && len(left) == 0, fmt.Sprintf("owner sessions %d, alive %v", s.Report.Counts["sessions"], left)
	})
	if sandboxGone(sb) {
		t.Errorf("the sandbox %s of a session closed without a verdict was removed; it is kept by default", sb)
	}

	kept := newEnv(t, options{steps: steps, stepS: 0.2})
	id = kept.rollout("kept")
	ch2 := kept.startRun("/run", id, kept.body(id, steps, kept.opts.stepS))
	sb, _ = kept.recordedProcs(id)
	if res := await(t, ch2).result(t); res.Reward != 1 {
		t.Errorf("with --keep-sandboxes: %+v, want reward 1", res)
	}
	if _, err := os.Stat(filepath.Join(kept.base, "sandboxes", sb)); err != nil {
		t.Errorf("with --keep-sandboxes the verified session's sandbox went: %v", err)
	}
}
