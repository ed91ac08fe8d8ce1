package opencodee2e

import (
	"testing"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
)

// TestNgdriverRunOpenCode: the path a user takes by hand, `ngdriver run
// --adapter opencode --harness-bin OPENCODE --model-url URL` (the static
// binary, the adapter table's opencode entry with ngresume beside it, its
// section filled from the flags), with a checkpoint while OpenCode's tool
// runs and a crash of the driver after it, on each version: the rollout
// ends with reward 1 after a relaunch (continued through ngresume, or
// started over if OpenCode had saved no model response by the checkpoint,
// as the log says), no main-turn request repeats another of its attempt
// (of the run, when continued), and each carries the task as its only
// user message.
func TestNgdriverRunOpenCode(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, func(t *testing.T, oc openCode) {
		run := suite.NgdriverRun(t, "opencode", oc.bin, script("sleep 40; touch done.txt", "touch done.txt"), task, check,
			harnesstest.CLITimes{CheckpointAt: "12s", CrashAt: "16s"}) // OpenCode takes seconds to start
		main := mainTurns(run.Requests)
		run.CheckNoRepeats(t, func(t *testing.T, reqs []fakemodel.Request) { checkNoRepeats(t, mainTurns(reqs)) })
		for _, q := range main {
			users := 0
			for _, m := range q.Messages {
				if m.Role == "user" {
					users++
					if m.Content != task {
						t.Errorf("request %s: a user message %.120q, want the task", harnesstest.DescribeRequest(q), m.Content)
					}
				}
			}
			if users != 1 {
				t.Errorf("request %s: %d user messages, want the task alone", harnesstest.DescribeRequest(q), users)
			}
		}
		if len(run.Launches) == 0 {
			return // NgdriverRun said why
		}
		last := run.Launches[len(run.Launches)-1]
		t.Logf("reward %v in %d launches; the last resumed %v: %q; %d main-turn requests", run.Reward, len(run.Launches), last.Resumed, last.Reason, len(main))
	})
}
