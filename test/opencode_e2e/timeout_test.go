package opencodee2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/test/fakemodel"
)

// The tool call of TestPausedTimeCountsTowardToolTimeout: toolSteps steps
// of a second (16 s of work in all) under a bash timeout of toolTimeoutMS,
// paused for toolPause, longer than the timeout. The work left after the
// pause (about 15 s) is what OpenCode has to act on its expired timer
// before the command ends by itself: with 5 s it did not always, at a load
// average of 12.
const (
	toolSteps     = 16
	toolTimeoutMS = 20000
	toolPause     = 22 * time.Second
	// timeoutText is what OpenCode's bash tool tells the model when its
	// timer for a command ran out (it then kills the command).
	timeoutText = "shell tool terminated command after exceeding timeout"
)

// TestPausedTimeCountsTowardToolTimeout documents how OpenCode behaves
// (not what we would want, but what a signal-level pause gives): time a
// launch spends paused counts toward OpenCode's own timers. The model
// calls the bash tool with a timeout of 20 s on a command that needs 16 s
// (sixteen steps of `sleep 1`); a checkpoint pauses the launch in place
// mid-tool for 22 s, then it continues. OpenCode's timer (on the monotonic
// clock, which no pause stops) has run out by then, so as soon as OpenCode
// runs again it ends the tool call for its timeout and tells the model so
// ("shell tool terminated command after exceeding timeout 20000 ms"),
// killing the command, whose steps stop short: done.txt is usually never
// written and the run loses its reward. (On a loaded machine the command
// may finish its last steps before OpenCode gets the CPU back; the model
// is still told the command timed out, so the test asserts that, and logs
// the rest.)
//
// If this test fails because the tool call survived the pause (no timeout
// text reached the model), OpenCode has changed: the README's paragraph on
// tools with timeouts (and paused_s) must be updated to match, and this
// test with it.
func TestPausedTimeCountsTowardToolTimeout(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testPausedTimeCountsTowardToolTimeout)
}

func testPausedTimeCountsTowardToolTimeout(t *testing.T, ver openCode) {
	command := fmt.Sprintf("for i in $(seq %d); do sleep 1; echo step $i; done; touch done.txt", toolSteps)
	w := newWorld(t, ver, "tooltimeout", fakemodel.Options{Script: func(r fakemodel.Request) fakemodel.Reply {
		switch {
		case !r.HasTools:
			return fakemodel.Reply{Text: titleText}
		case r.LastMessage().Role == "tool":
			return fakemodel.Reply{Text: finalText}
		default:
			return bashCall(command, toolTimeoutMS)
		}
	}})
	p := newParticipant()
	h := w.Start(w.Runner(w.adapter(nil), p), 1)
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	// The pause comes once the command's second step runs: by then
	// OpenCode has armed its timer (a pause 60 ms after the first sleep
	// showed once came before it did, in CI, and the timer then started
	// after the continue).
	first := map[int]bool{}
	for _, p := range w.WaitProc(sb, l1, "sleep").Processes {
		if p.Comm == "sleep" {
			first[p.PID] = true
		}
	}
	w.Eventually("the command's second step", func() (bool, string) {
		tr, err := w.Suite.Tree(w.LaunchDir(sb, l1))
		if err != nil {
			return false, err.Error()
		}
		for _, p := range tr.Processes {
			if p.Comm == "sleep" && !first[p.PID] {
				return true, ""
			}
		}
		return false, harnesstest.DescribeTree(tr)
	})
	seen := time.Now()

	w.Prepare(p, "ck-1")
	paused := time.Now()
	a := w.Observe(sb, l1)
	if !slices.Contains(harnesstest.Comms(a), "sleep") {
		t.Fatalf("the command had ended before the pause held it (paused %v, %s after it was seen running): the machine is too slow for this test",
			harnesstest.Comms(a), paused.Sub(seen).Round(time.Millisecond))
	}
	time.Sleep(toolPause)
	w.Resume(p, "ck-1")
	continued := time.Now()

	raw, err := w.Wait(h)
	if err != nil {
		t.Fatalf("the run failed: %v", err)
	}
	r := parseResult(t, raw)
	if len(r.Launches) != 1 || r.Launches[0].Pauses != 1 || r.Launches[0].Outcome != driver.OutcomeFinished {
		t.Errorf("launches %+v; want one, paused once, finished (OpenCode itself exits 0)", r.Launches)
	}
	mains := mainTurns(harnesstest.ByAttempt(w.Model.Requests(), 1))
	if len(mains) != 2 {
		t.Fatalf("%d main-turn model requests, want the tool call and the request after it", len(mains))
	}
	result := mains[1].LastMessage()
	if result.Role != "tool" || !strings.Contains(result.Content, fmt.Sprintf("%s %d ms", timeoutText, toolTimeoutMS)) {
		t.Errorf("after the pause the model got %s %q; want the tool result saying the command exceeded its timeout (%q)",
			result.Role, result.Content, timeoutText)
	}
	steps := strings.Count(result.Content, "step ")
	_, err = os.Stat(filepath.Join(w.Local.HostPath(sb), local.WorkFolder, "done.txt"))
	t.Logf("the command (timeout %d ms, %d steps of 1 s) was seen running, paused %s later, held for %s; the model's next request came %s after the continue: "+
		"the tool result says it timed out after %d of %d steps (done.txt written: %v; reward %v): %q",
		toolTimeoutMS, toolSteps, paused.Sub(seen).Round(time.Millisecond), continued.Sub(paused).Round(time.Millisecond),
		mains[1].Received.Sub(continued).Round(time.Millisecond), steps, toolSteps, err == nil, r.Reward, result.Content)
}

// parseResult reads a run's result.
func parseResult(t *testing.T, raw []byte) result {
	t.Helper()
	var r result
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("the result is not JSON: %v\n%s", err, raw)
	}
	return r
}
