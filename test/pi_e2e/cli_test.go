package pie2e

import (
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

// TestNgdriverRunPi: the path a user takes by hand, `ngdriver run
// --adapter pi --harness-bin PI --model-url URL` (the static binary, the
// adapter table's pi row, its section filled from the flags, node found on
// the launch's PATH), with a checkpoint while Pi's tool runs and a crash
// of the driver after it: the rollout ends with reward 1, the log shows
// the relaunch after the restore and why, and no model request carries a
// user turn the task did not have.
func TestNgdriverRunPi(t *testing.T) {
	t.Parallel()
	run := suite.NgdriverRun(t, "pi", piBin(t), script("sleep 20; touch done.txt", "touch done.txt"), task, check, harnesstest.CLITimes{CheckpointAt: "3s", CrashAt: "6s"})
	run.CheckNoRepeats(t, harnesstest.CheckNoRepeats)
	checkTaskOnly(t, run.Requests)
	if len(run.Launches) == 0 {
		return // NgdriverRun said why
	}
	last := run.Launches[len(run.Launches)-1]
	t.Logf("reward %v in %d launches; the last resumed %v: %q; %d model requests", run.Reward, len(run.Launches), last.Resumed, last.Reason, len(run.Requests))
}
