package httpowner_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/httpowner"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestClientHandsOnGymRefusals proves that an owner's refusal in Gym's
// envelope comes back as the same refusal (so the driver answers its
// caller with Gym's status and code, not a 500), a 410 as owner.ErrClosed,
// and any other 4xx as a plain *httpowner.Error; and that every call goes
// to /ng-rollout/<key>/.
func TestClientHandsOnGymRefusals(t *testing.T) {
	var paths []string
	answer := func(w http.ResponseWriter, status int, body any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(body)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		switch r.URL.Path {
		case "/ng-rollout/r-a1/seed_session":
			answer(w, 409, gym.ErrorBody{Error: gym.ErrorDetail{Code: gym.CodeStaleAttempt, Detail: "retired"}})
		case "/ng-rollout/r-a1/sandbox_access":
			answer(w, 410, map[string]string{"error": "closed"})
		default:
			answer(w, 400, map[string]string{"error": "no"})
		}
	}))
	defer srv.Close()
	c := &httpowner.Client{BaseURL: srv.URL}
	ctx := context.Background()
	if _, err := c.SeedSession(ctx, "r-a1", json.RawMessage(`{}`)); !errors.Is(err, gym.ErrStaleAttempt) {
		t.Errorf("seed refused with stale_attempt: %v, want gym.ErrStaleAttempt", err)
	}
	if _, err := c.SandboxAccess(ctx, "r-a1", nil); !errors.Is(err, owner.ErrClosed) {
		t.Errorf("sandbox_access answered 410: %v, want owner.ErrClosed", err)
	}
	var he *httpowner.Error
	if err := c.CloseSession(ctx, "r-a1", nil); !errors.As(err, &he) || he.Status != 400 || errors.Is(err, gym.ErrRefused) {
		t.Errorf("close_session answered 400: %v, want a plain *httpowner.Error", err)
	}
	want := []string{"/ng-rollout/r-a1/seed_session", "/ng-rollout/r-a1/sandbox_access", "/ng-rollout/r-a1/close_session"}
	if len(paths) != len(want) || paths[0] != want[0] || paths[1] != want[1] || paths[2] != want[2] {
		t.Errorf("paths %v, want %v", paths, want)
	}
}
