package codexe2e

import (
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

// TestNgdriverRunCodex: the path a user takes by hand, `ngdriver run
// --adapter codex --harness-bin CODEX --model-url URL` (the static binary,
// the adapter table's codex entry, its section filled from the flags),
// with a checkpoint while Codex's tool runs and a crash of the driver after
// it: the rollout ends with reward 1, the relaunch after the restore
// starts over (Codex cannot continue without an added turn) and says why,
// and no model request carries a user turn the task did not have.
func TestNgdriverRunCodex(t *testing.T) {
	t.Parallel()
	run := suite.NgdriverRun(t, "codex", codexBin(t), script("sleep 20; touch done.txt", "touch done.txt"), task, check, harnesstest.CLITimes{CheckpointAt: "3s", CrashAt: "6s"})
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
	if last.Resumed || !strings.Contains(last.Reason, "starting over with the task in a fresh CODEX_HOME") {
		t.Errorf("the last launch: resumed %v, reason %q; want a fresh start saying why", last.Resumed, last.Reason)
	}
	t.Logf("reward %v in %d launches; the last resumed %v: %q; %d model requests", run.Reward, len(run.Launches), last.Resumed, last.Reason, len(run.Requests))
}
