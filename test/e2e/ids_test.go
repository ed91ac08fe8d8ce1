package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRolloutIDsAreBounded: a rollout id must be 1 to 128 characters
// matching ^[A-Za-z0-9][A-Za-z0-9._-]*$, in the body or the path. Others get
// 400 naming the rule, with at most a short prefix of the id in the reply and
// in the driver's log (a 60 MB id was once accepted, answered by a 500 whose
// body repeated it whole, and logged four times over). An id of exactly 128
// characters runs.
func TestRolloutIDsAreBounded(t *testing.T) {
	e := newEnv(t, options{})
	const rule = "^[A-Za-z0-9][A-Za-z0-9._-]*$"
	huge := e.rollout(strings.Repeat("x", 8<<20))
	bad := []string{huge, e.rollout(strings.Repeat("y", 129)), "dup:1", "dup/1", ".hidden", "-dash", "_under", "sp ace", "tab\t", "é", "a\nb"}
	logBefore := driverLogSize(t, e)
	for _, id := range bad {
		r := postRun(t.Context(), e.ctl.url, "/run", id[:min(len(id), 40)], e.body(id, 2, 0.05))
		if r.err != nil || r.status != http.StatusBadRequest || !strings.Contains(string(r.body), rule) {
			t.Errorf("POST /run with rollout id %.40q (%d bytes): %s, want 400 naming the rule %s", id, len(id), r, rule)
		}
		if len(r.body) > 1000 {
			t.Errorf("the reply to a bad rollout id of %d bytes is %d bytes long", len(id), len(r.body))
		}
	}
	if grown := driverLogSize(t, e) - logBefore; grown > 64<<10 {
		t.Errorf("the driver's log grew by %d bytes for %d refused requests", grown, len(bad))
	}
	// In the path, as the framework's prefix carries it.
	for _, path := range []string{"/ng-rollout/dup:1/run", "/ng-rollout/" + strings.Repeat("z", 200) + "-a1/run"} {
		b := e.body("", 2, 0.05)
		delete(b, "rollout_id")
		if r := postRun(t.Context(), e.ctl.url, path, "path", b); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), rule) {
			t.Errorf("POST %.60s: %s, want 400 naming the rule", path, r)
		}
	}
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

// driverLogSize is how many bytes the current driver has logged.
func driverLogSize(t *testing.T, e *env) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(e.logs, e.driver().name+".stderr"))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
