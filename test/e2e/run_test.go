package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/proto"
)

// TestRunCrashInsideHoldFiresOnTime: `ngdriver run --crash-at` that falls
// inside a checkpoint's --hold fires on time (it once waited for the hold to
// end): the crash comes while the run is parked, that checkpoint is never
// opened, it is the one restored, and the rollout still ends with reward 1.
func TestRunCrashInsideHoldFiresOnTime(t *testing.T) {
	code, stdout, stderr := runCLI(t, nil, "run", "--steps", "10", "--step", "300ms",
		"--checkpoint-at", "1s", "--hold", "20s", "--crash-at", "4s", "--state-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("ngdriver run exited %d:\n%s", code, stderr)
	}
	var res struct {
		Reward float64 `json:"reward"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || res.Reward != 1 {
		t.Errorf("result %q (%v), want reward 1", stdout, err)
	}
	crash := strings.Index(stderr, "crash: the driver is abandoned")
	if crash < 0 {
		t.Fatalf("no crash in the log:\n%s", stderr)
	}
	if opened := strings.Index(stderr, `msg="checkpoint opened"`); opened >= 0 && opened < crash {
		t.Errorf("the checkpoint opened before the crash due inside its hold:\n%s", stderr)
	}
	if !strings.Contains(stderr[crash:], "msg=restored checkpoint=ckpt-1") {
		t.Errorf("the crash did not restore the checkpoint it fell in:\n%s", stderr)
	}
}

// TestRunDemoDoesNotWarn: `make demo`'s own run (a checkpoint at 2s, a
// crash at 6s restored into a fork of the snapshot) ends with reward 1 and
// warns of nothing but the crash it was asked for. The fork carries the
// first launch's folder; the owner's stop of the fork at the end of the
// session once took it for a launch of the fork, found no supervisor and
// warned "the stop could not make sure the launch is gone ... partial=true"
// after scanning every process on the host for its tag. That folder is
// recognised as a copy: `ngsup stop` of it answers copied.
func TestRunDemoDoesNotWarn(t *testing.T) {
	state := t.TempDir()
	code, stdout, stderr := runCLI(t, nil, "run", "--steps", "16", "--step", "500ms",
		"--checkpoint-at", "2s", "--crash-at", "6s", "--state-dir", state)
	if code != 0 {
		t.Fatalf("ngdriver run exited %d:\n%s", code, stderr)
	}
	var res result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || res.Reward != 1 || len(res.Launches) != 2 {
		t.Fatalf("result %q (%v), want reward 1 from two launches (the crash's and the relaunch in the fork)", stdout, err)
	}
	if strings.Contains(stderr, "the stop could not make sure the launch is gone") {
		t.Errorf("the happy path warned of an unsure stop:\n%s", stderr)
	}
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "level=WARN") && !strings.Contains(line, `msg="crash: the driver is abandoned`) {
			t.Errorf("the happy path warned: %s", line)
		}
	}
	first, fork := res.Launches[0], res.Launches[1].SandboxID
	copied := filepath.Join(state, "sandboxes", fork, ".ngharness", "launches", first.ID)
	out, err := exec.Command(ngsupBin, "stop", "--grace", "0s", "--dir", copied).Output()
	var stop proto.StopResult
	if err != nil || json.Unmarshal(out, &stop) != nil || !stop.Copied || !stop.Stopped || len(stop.Searched) != 0 {
		t.Errorf("ngsup stop of the first launch's folder in the fork %s: %v %s, want copied, nothing searched", fork, err, out)
	}
}
