package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestRunIdentity proves how /run finds its attempt: the body as Gym's
// collector sends it wins, the /ng-rollout/<key>/ prefix names it when the
// body does not, the two must agree when both do, and a malformed key or
// id is refused (422), never rewritten.
func TestRunIdentity(t *testing.T) {
	cases := []struct {
		name, path, body string
		want             gym.EpisodeID
		err              error
	}{
		{"body id", "/run", `{"_ng_rollout_id":"r1"}`, gym.EpisodeID{RolloutID: "r1"}, nil},
		{"body indexes and attempt", "/run", `{"_ng_task_index":3,"_ng_rollout_index":1,"_ng_attempt_index":2}`, gym.EpisodeID{RolloutID: "3-1", Attempt: 2}, nil},
		{"none", "/run", `{"task":"x"}`, gym.EpisodeID{}, gym.ErrRolloutIDRequired},
		{"path only", "/ng-rollout/r2-a3/run", `{"task":"x"}`, gym.EpisodeID{RolloutID: "r2", Attempt: 3}, nil},
		{"path and body agree", "/ng-rollout/r2-a1/run", `{"_ng_rollout_id":"r2","_ng_attempt_index":1}`, gym.EpisodeID{RolloutID: "r2", Attempt: 1}, nil},
		{"path and body disagree", "/ng-rollout/r2/run", `{"_ng_rollout_id":"r3"}`, gym.EpisodeID{}, gym.ErrInvalidRequest},
		{"malformed path key", "/ng-rollout/-bad/run", `{}`, gym.EpisodeID{}, gym.ErrInvalidRequest},
		{"malformed body id", "/run", `{"_ng_rollout_id":"a b"}`, gym.EpisodeID{}, gym.ErrInvalidRequest},
	}
	for _, c := range cases {
		var got gym.EpisodeID
		var gotErr error
		mux := http.NewServeMux()
		h := func(w http.ResponseWriter, r *http.Request) { got, gotErr = runIdentity(r, []byte(c.body)) }
		mux.HandleFunc("POST /run", h)
		mux.HandleFunc("POST /ng-rollout/{key}/run", h)
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, c.path, nil))
		if c.err != nil {
			if !errors.Is(gotErr, c.err) {
				t.Errorf("%s: err %v, want %v", c.name, gotErr, c.err)
			}
			continue
		}
		if gotErr != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, gotErr, c.want)
		}
	}
}

// TestClassify proves the one table of statuses and codes: Gym's refusals
// keep Gym's, the driver's own classes get theirs, anything else is 500.
func TestClassify(t *testing.T) {
	cases := []struct {
		err    error
		status int
		code   string
	}{
		{gym.Refuse(gym.ErrStaleAttempt, "x"), 409, gym.CodeStaleAttempt},
		{gym.Refuse(gym.ErrCheckpointParked, "x"), 409, gym.CodeCheckpointParked},
		{gym.Refuse(gym.ErrRolloutIDRequired, "x"), 400, gym.CodeRolloutIDRequired},
		{fmt.Errorf("wrapped: %w", gym.ErrCheckpointState), 422, gym.CodeCheckpointState},
		{fmt.Errorf("run r: %w", driver.ErrBadRequest), 400, CodeBadRequest},
		{fmt.Errorf("run r: %w", driver.ErrBadBookmark), 400, CodeBadRequest},
		{fmt.Errorf("run r: %w", driver.ErrDuplicateRun), 409, CodeRunInFlight},
		{driver.ErrShuttingDown, 503, CodeShuttingDown},
		{fmt.Errorf("seed: %w", owner.ErrClosed), 409, CodeSessionClosed},
		{fmt.Errorf("run r: %w", context.Canceled), 499, CodeCancelled},
		{errors.New("disk on fire"), 500, gym.CodeInternal},
	}
	for _, c := range cases {
		if status, code := classify(c.err); status != c.status || code != c.code {
			t.Errorf("%v: %d %s, want %d %s", c.err, status, code, c.status, c.code)
		}
	}
}
