package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

// cgroupFile names the file that asks for a freeze of a launch's cgroup,
// and the values that freeze and thaw it, by hierarchy version.
func cgroupFile(rc proto.Receipt) (file, frozen, thawed string) {
	if rc.CgroupVersion == 2 {
		return filepath.Join(rc.Cgroup, "cgroup.freeze"), "1", "0"
	}
	return filepath.Join(rc.Cgroup, "freezer.state"), "FROZEN", "THAWED"
}

// cgroupFrozen reports whether the kernel has the cgroup frozen.
func cgroupFrozen(rc proto.Receipt) bool {
	if rc.CgroupVersion == 2 {
		return strings.Contains(string(readFile(filepath.Join(rc.Cgroup, "cgroup.events"))), "frozen 1")
	}
	return strings.TrimSpace(string(readFile(filepath.Join(rc.Cgroup, "freezer.state")))) == "FROZEN"
}

// TestPauseRecoversAbandonedFreeze proves that a pause which finds the
// launch's cgroup frozen by a pause that died between freeze and thaw (made
// here by freezing it by hand) recovers: it exits 0 saying so, every
// process is stopped (T), the cgroup is thawed, and continue wakes them all.
// The pause is run without --cgroup-first, as the driver runs it.
func TestPauseRecoversAbandonedFreeze(t *testing.T) {
	t.Parallel()
	requireRoot(t, "ngsup makes the launch's cgroup only as root")
	if !cgroupFreezerMounted() {
		t.Skip("no cgroup2 or cgroup v1 freezer mount: ngsup runs launches without a cgroup here")
	}
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg", "-setsid", "-daemon"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid", "daemon"} {
		procs[role] = l.role(role)
	}
	rc := l.status()
	if rc.Cgroup == "" {
		t.Skipf("the launch got no cgroup (the sandbox let ngsup make none): %+v", rc)
	}
	file, frozen, thawed := cgroupFile(rc)
	if err := os.WriteFile(file, []byte(frozen), 0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the cgroup to freeze", func() (bool, string) { return cgroupFrozen(rc), rc.Cgroup })
	r := l.verb("pause")
	wantCode(t, r, 0)
	var res proto.PauseResult
	r.json(t, &res)
	if !res.Paused || !res.RecoveredFreeze {
		t.Errorf("pause: paused %v recovered_freeze %v, want true true: %+v", res.Paused, res.RecoveredFreeze, res)
	}
	for _, name := range sortedKeys(procs) {
		if st, err := readStat(procs[name].PID); err != nil || st.State != 'T' {
			t.Errorf("%s after the pause: state %c (%v), want T", name, st.State, err)
		}
	}
	if got := strings.TrimSpace(string(readFile(file))); got != thawed || cgroupFrozen(rc) {
		t.Errorf("the cgroup is still frozen after the pause: %s holds %q", file, got)
	}
	l.resume()
	waitRunning(t, procs)
}
