package claudee2e

import (
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

// TestNgdriverRunClaude: the path a user takes by hand, `ngdriver run
// --adapter claude --harness-bin CLAUDE --model-url URL` (the static
// binary, the adapter table's claude entry, its section filled from the
// flags), with a checkpoint while Claude Code's tool runs and a crash of
// the driver after it: the rollout ends with reward 1, the log shows the
// relaunch after the restore and why, and no model request carries a user
// turn the task did not have.
func TestNgdriverRunClaude(t *testing.T) {
	t.Parallel()
	run := suite.NgdriverRun(t, "claude", claudeBin(t), script("echo start; sleep 20; touch done.txt", "touch done.txt"), task, check, harnesstest.CLITimes{CheckpointAt: "3s", CrashAt: "6s"})
	run.CheckNoRepeats(t, harnesstest.CheckNoRepeats)
	for _, q := range run.Requests {
		if u := userTurns(q); len(u) != 1 || u[0] != task {
			t.Errorf("request %s: user turns %.120q, want the task alone", harnesstest.DescribeRequest(q), u)
		}
	}
	if len(run.Launches) == 0 {
		return // NgdriverRun said why
	}
	last := run.Launches[len(run.Launches)-1]
	t.Logf("reward %v in %d launches; the last resumed %v: %q; %d model requests", run.Reward, len(run.Launches), last.Resumed, last.Reason, len(run.Requests))
}
