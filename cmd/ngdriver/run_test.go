package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestRunPicksAUniqueRolloutID proves that two `ngdriver run` started
// without --rollout-id do not share a rollout id (they once both used
// demo-1, and so the same launch ids): each run body gets a new id.
func TestRunPicksAUniqueRolloutID(t *testing.T) {
	c := newRunCmd()
	if err := c.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	def := c.Flags().Lookup("rollout-id").DefValue
	ids := map[string]bool{}
	for i := 0; i < 2; i++ {
		body, err := buildBody(runFlags{rollout: def, adapter: "fake", steps: 2})
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			RolloutID string `json:"rollout_id"`
		}
		if err := json.Unmarshal(body, &meta); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(meta.RolloutID, "run-") {
			t.Errorf("the default rollout id is %q, want a new run-<time>-<random> id", meta.RolloutID)
		}
		ids[meta.RolloutID] = true
	}
	if len(ids) != 2 {
		t.Errorf("two runs without --rollout-id got the same rollout id: %v", ids)
	}
}
