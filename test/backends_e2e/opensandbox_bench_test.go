package backends_e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
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
	e := drivertest.NewOn(t, "opensandbox")
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(0, 0), p)
	var ros, sbs []string
	for i := range n {
		ro := e.Rollout(fmt.Sprintf("bench%d", i))
		e.Start(rn, ro, 1, task(ro, "count", 400, 0.25))
		ros = append(ros, ro)
	}
	for _, ro := range ros {
		sb := e.WaitSeeded(ro, 1).SandboxID
		e.WaitSteps(e.WaitSession(sb, ro), 2)
		sbs = append(sbs, sb)
	}
	ctx := context.Background()
	parts := e.Controls(p)
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
			before[sb] = len(e.OpenSandbox.Commands(sb))
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
			cmds := e.OpenSandbox.Commands(sb)
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

// TestOpenSandboxCommitFigures prints what the owner's commit of N
// sessions costs over the fake OpenSandbox at the real server's timing
// (NGHARNESS_BENCH_OSB=1; N from NGHARNESS_BENCH_OSB_COMMIT_N, a comma
// list, default 8,64,256): one snapshot per session, each freezing its
// sandbox while the server takes it (1.25 s alone, several sharing the
// server's capacity, as measured), through the backend with its default
// poll (500 ms, as owner serve has it). For each N: N sessions seeded
// through the owner, then 3 commits (the owner's prepare, then its
// commit, timed; then resume), with each sandbox's freeze. With
// NGHARNESS_BENCH_OSB_CAPACITY (default 1) the server takes that many
// snapshots at full speed at once. The figures are in docs/BENCHMARKS.md.
func TestOpenSandboxCommitFigures(t *testing.T) {
	if os.Getenv("NGHARNESS_BENCH_OSB") != "1" {
		t.Skip("NGHARNESS_BENCH_OSB=1 prints the OpenSandbox commit figures")
	}
	if os.Geteuid() != 0 {
		t.Skip("the fake OpenSandbox needs root")
	}
	ns := []int{8, 64, 256}
	if v := os.Getenv("NGHARNESS_BENCH_OSB_COMMIT_N"); v != "" {
		ns = nil
		for _, f := range strings.Split(v, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil || n < 1 {
				t.Fatalf("NGHARNESS_BENCH_OSB_COMMIT_N=%q: %q is not a count", v, f)
			}
			ns = append(ns, n)
		}
	}
	capacity := 1
	if v := os.Getenv("NGHARNESS_BENCH_OSB_CAPACITY"); v != "" {
		fmt.Sscan(v, &capacity)
	}
	for _, n := range ns {
		commitFigures(t, n, capacity)
	}
}

func commitFigures(t *testing.T, n, capacity int) {
	ctx := context.Background()
	srv, err := fakeexecd.Start(fakeexecd.Options{Base: t.TempDir(), APIKey: "bench-key", SnapshotCapacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	b, err := opensandbox.New(opensandbox.Options{Server: srv.URL(), APIKey: "bench-key", Image: "bench",
		Root: local.DefaultMountPoint + "/" + local.RootFolder, Workdir: local.DefaultMountPoint + "/" + local.WorkFolder})
	if err != nil {
		t.Fatal(err)
	}
	own := lending.New(lending.Options{Sandboxes: b, Logger: slog.New(slog.DiscardHandler)})
	ctl, err := owner.NewControl(own, gym.Config{Instance: "bench_owner", LeaseGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			ro := fmt.Sprintf("commit%d-%s-r%d", n, runTag, i)
			_, err := own.SeedSession(ctx, ro, json.RawMessage(`{"rollout_id":"`+ro+`"}`))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	seeded := time.Since(t0)
	var commits, freezes []time.Duration
	for k := range 3 {
		id := fmt.Sprintf("bench-commit-%d-%d", n, k)
		req := gym.Request{CheckpointID: id, DeadlineTS: float64(time.Now().Add(time.Hour).UnixNano()) / 1e9}
		if rep, err := ctl.Prepare(ctx, req); err != nil || rep.Phase != gym.PhasePrepared {
			t.Fatalf("prepare %s: %+v %v", id, rep, err)
		}
		before := len(srv.Freezes())
		t1 := time.Now()
		if _, err := ctl.Commit(ctx, &gym.CommitRequest{Request: req, CheckpointDir: filepath.Join(t.TempDir(), id)}); err != nil {
			t.Fatalf("commit %s: %v", id, err)
		}
		commits = append(commits, time.Since(t1))
		for _, fz := range srv.Freezes()[before:] {
			freezes = append(freezes, fz.End.Sub(fz.Start))
		}
		if _, err := ctl.Resume(ctx, req); err != nil {
			t.Fatalf("resume %s: %v", id, err)
		}
	}
	sort.Slice(freezes, func(i, j int) bool { return freezes[i] < freezes[j] })
	med := append([]time.Duration(nil), commits...)
	sort.Slice(med, func(i, j int) bool { return med[i] < med[j] })
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("N=%d sessions, server capacity %d, owner seeded them in %.1f s; commit %s; %.2f snapshots/s; each sandbox frozen median %.1f s, max %.1f s (%d freezes); load average %s",
		n, capacity, seeded.Seconds(), durs(commits), float64(n)/med[len(med)/2].Seconds(),
		freezes[len(freezes)/2].Seconds(), freezes[len(freezes)-1].Seconds(), len(freezes), strings.Join(strings.Fields(string(load))[:3], " "))
}
