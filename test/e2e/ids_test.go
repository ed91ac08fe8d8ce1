package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/serve"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestRolloutIDsAreBounded: a rollout id, from _ng_rollout_id or the
// path, must match Gym's rule ^[A-Za-z0-9][A-Za-z0-9._-]*$ (else 422
// invalid_request naming the field or the key) and be at most 128
// characters, the driver's own bound (else 400 bad_request naming the
// rule); a refused id registers no run. An id of exactly 128 characters
// runs.
func TestRolloutIDsAreBounded(t *testing.T) {
	e := newEnv(t, options{})
	for _, id := range []string{e.rollout(strings.Repeat("y", 129))} {
		checkIDRefused(t, id, postRun(t.Context(), e.ctl.url, "/run", id[:40], e.body(id, 2, 0.05)), http.StatusBadRequest, serve.CodeBadRequest, idRule)
	}
	for _, id := range []string{"dup:1", "dup/1", ".hidden", "-dash", "_under", "sp ace", "tab\t", "é", "a\nb"} {
		checkIDRefused(t, id, postRun(t.Context(), e.ctl.url, "/run", id, e.body(id, 2, 0.05)), http.StatusUnprocessableEntity, gym.CodeInvalidRequest, gym.FieldRolloutID)
	}
	// In the path, as Gym's prefix carries it (the body names no rollout).
	b := e.body("", 2, 0.05)
	delete(b, "_ng_rollout_id")
	checkIDRefused(t, "dup:1", postRun(t.Context(), e.ctl.url, "/ng-rollout/dup:1/run", "path", b), http.StatusUnprocessableEntity, gym.CodeInvalidRequest, "dup:1")
	long := strings.Repeat("z", 200)
	checkIDRefused(t, long, postRun(t.Context(), e.ctl.url, "/ng-rollout/"+long+"-a1/run", "path", b), http.StatusBadRequest, serve.CodeBadRequest, idRule)
	if h := e.health(); h.Runs != 0 {
		t.Errorf("refused runs were registered: %d runs", h.Runs)
	}
	// The longest id allowed runs.
	id := e.rollout("")
	id += strings.Repeat("k", 128-len(id))
	if res := postRun(t.Context(), e.ctl.url, "/run", id, e.body(id, 2, 0.05)).result(t); res.Reward != 1 {
		t.Errorf("a rollout id of 128 characters: %+v, want reward 1", res)
	}
}

// TestHugeRolloutIDsAreNotEchoed: an 8 MB rollout id, too long (400
// bad_request naming the rule) or also malformed (422 invalid_request
// naming _ng_rollout_id), is answered with at most a short prefix of it in
// the reply and the driver's log (a 60 MB id was once accepted, answered
// by a 500 whose body repeated it whole, and logged four times over).
func TestHugeRolloutIDsAreNotEchoed(t *testing.T) {
	e := newEnv(t, options{})
	huge := e.rollout(strings.Repeat("x", 8<<20))
	logBefore := driverLogSize(t, e)
	checkIDRefused(t, huge, postRun(t.Context(), e.ctl.url, "/run", huge[:40], e.body(huge, 2, 0.05)), http.StatusBadRequest, serve.CodeBadRequest, idRule)
	checkIDRefused(t, huge+":", postRun(t.Context(), e.ctl.url, "/run", huge[:40], e.body(huge+":", 2, 0.05)), http.StatusUnprocessableEntity, gym.CodeInvalidRequest, gym.FieldRolloutID)
	if grown := driverLogSize(t, e) - logBefore; grown > 64<<10 {
		t.Errorf("the driver's log grew by %d bytes for 2 refused requests", grown)
	}
	if h := e.health(); h.Runs != 0 {
		t.Errorf("refused runs were registered: %d runs", h.Runs)
	}
}

// idRule is the rule a refusal of a too long rollout id names.
const idRule = "^[A-Za-z0-9][A-Za-z0-9._-]*$"

// checkIDRefused checks the reply to a run with a bad rollout id: status,
// Gym's code, an error naming names, and at most 1000 bytes.
func checkIDRefused(t *testing.T, id string, r runReply, status int, code, names string) {
	t.Helper()
	if r.err != nil || r.status != status || !strings.Contains(string(r.body), `"code":"`+code+`"`) || !strings.Contains(string(r.body), names) {
		t.Errorf("POST /run with rollout id %.40q (%d bytes): %s, want %d %s naming %s", id, len(id), r, status, code, names)
	}
	if len(r.body) > 1000 {
		t.Errorf("the reply to a bad rollout id of %d bytes is %d bytes long", len(id), len(r.body))
	}
}

// driverLogSize is how many bytes the current driver has logged.
func driverLogSize(t *testing.T, e *env) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(e.logs, e.driver().Name+".stderr"))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
