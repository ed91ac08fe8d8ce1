package opencodee2e

import (
	"context"
	"encoding/json"
	"testing"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
)

// TestRolloutURLEscapedInOpenCode: real OpenCode, launched as the adapter
// launches it (its command and environment, run in a local sandbox) for a
// rollout id holding '?', '#', '/' and '%', sends every model request to
// the rollout's own path: the fake model reads back the exact id and the
// attempt from each. Before the fix the '?' made the rest of the base URL
// a query, so the requests reached /ng-rollout/<part of the id> instead.
func TestRolloutURLEscapedInOpenCode(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testRolloutURLEscapedInOpenCode)
}

func testRolloutURLEscapedInOpenCode(t *testing.T, ver openCode) {
	w := newWorld(t, ver, "url", fakemodel.Options{Script: script("touch done.txt", "touch done.txt")})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	sb, err := w.Local.Create(ctx, "url-1")
	if err != nil {
		t.Fatal(err)
	}
	lent := harness.LentSandbox{Sandbox: sb}
	rollout := w.Rollout + "?x=1#f/g%41"
	a := w.adapter(nil)
	state, err := a.NewState(rollout, 1, lent)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]string{"task": task})
	spec, err := a.Launch(ctx, harness.LaunchContext{RolloutID: rollout, Attempt: 1, Input: body, Sandbox: lent, State: state})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: spec.Argv, Env: spec.Env, Dir: spec.Dir, Timeout: patience})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("opencode run: exit %d (%v): %.2000s", res.ExitCode, err, res.Stderr)
	}
	reqs := w.Model.Requests()
	if len(reqs) != 3 {
		t.Errorf("%d model requests, want 3 (title, tool call, final)", len(reqs))
	}
	for i, r := range reqs {
		if r.Rollout != rollout+"-a1" || r.Attempt != 1 {
			t.Errorf("model request %d to %s: rollout %q attempt %d, want %q attempt 1", i+1, r.Path, r.Rollout, r.Attempt, rollout+"-a1")
		}
	}
	if len(reqs) > 0 {
		t.Logf("rollout id %q: %d model requests, each to %s", rollout, len(reqs), reqs[0].Path)
	}
}
