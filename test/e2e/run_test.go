package e2e

import (
	"encoding/json"
	"strings"
	"testing"
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
