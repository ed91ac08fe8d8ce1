package gyme2e

import (
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestCollectorRows: rows as Gym's collector and its callers send them. An
// explicit _ng_rollout_id wins over the indexes; _ng_attempt_index (here a
// numeric string, as Gym's tests coerce it) is the attempt. Each reply carries a
// numeric reward, the response object and ng_harness_launches, the launch
// named after the rollout and attempt; a failed check is reward 0, filed
// as a success. /aggregate_metrics over the three gives mean/reward 2/3,
// and over none Gym's empty metrics.
func TestCollectorRows(t *testing.T) {
	w := newWorld(t, options{})
	explicit := w.coll.row(5, 0, job{steps: 2, stepS: 0.05})
	explicit[gym.FieldRolloutID] = "alpha-1"
	later := w.coll.row(7, 1, job{steps: 2, stepS: 0.05})
	later[gym.FieldAttemptIndex] = "2"
	failing := w.coll.row(8, 3, job{steps: 2, stepS: 0.05})
	failing["check"] = "false"
	rows := []row{explicit, later, failing}
	wantPrefix := []string{"alpha-1-a0-l1-", "7-1-a2-l1-", "8-3-a0-l1-"}
	wantReward := []float64{1, 1, 0}
	var replies []rolloutReply
	for i, r := range rows {
		res := w.coll.post(t.Context(), r).reply(t)
		replies = append(replies, res)
		if res.Reward != wantReward[i] {
			t.Errorf("row %d: reward %v, want %v", i, res.Reward, wantReward[i])
		}
		if len(res.Launches) != 1 || !strings.HasPrefix(res.Launches[0].ID, wantPrefix[i]) {
			t.Errorf("row %d: launches %+v, want one named %s...", i, res.Launches, wantPrefix[i])
		}
	}
	if got := e2eproc.SessionSteps(w.base, "5-0"); len(got) != 0 {
		t.Errorf("the explicit id did not win: a session of 5-0 holds %q", got)
	}
	if got := e2eproc.SessionSteps(w.base, "alpha-1"); len(got) != 2 {
		t.Errorf("the explicit rollout alpha-1 has steps %q, want 2", got)
	}
	agg := w.coll.aggregate(t, rows, replies)
	if m := meanReward(t, agg); !near(m, 2.0/3) {
		t.Errorf("/aggregate_metrics: mean/reward %v, want 2/3", m)
	}
	// No rollout at all: Gym's empty AggregateMetrics().
	empty := w.coll.aggregate(t, nil, nil)
	if string(empty["agent_metrics"]) != "{}" || string(empty["key_metrics"]) != "{}" || string(empty["group_level_metrics"]) != "[]" {
		t.Errorf("/aggregate_metrics of nothing: %v, want empty metrics", empty)
	}
}
