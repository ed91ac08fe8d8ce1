package e2e

// Who reaches what on the two servers, over their real binaries: the
// control routes turn a caller without the token away before reading its
// body, no error reply is longer than the documented cap, /metrics carries
// the Go runtime's and the process's figures on both, and a run restored at
// its seed bookmark still finds its way on the owner, whose sessions answer
// only their cookie's holder.

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/owner/httpowner"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/gym"
)

// wantCapped checks a refusal's text (in any shape) is there and within
// gym.MaxDetailBytes, and the whole reply small.
func wantCapped(t *testing.T, r ctlReply, status int, code string) {
	t.Helper()
	if r.status != status || r.errorCode() != code {
		t.Errorf("%.400s, want %d %s", r, status, code)
	}
	if text := r.errorText(); text == "" || len(text) > gym.MaxDetailBytes || len(r.body) > 6*gym.MaxDetailBytes {
		t.Errorf("%s: a reply of %d bytes whose text is %d bytes, want at most %d: %.300s", r.call, len(r.body), len(text), gym.MaxDetailBytes, r.body)
	}
}

// TestControlRoutesCheckTheTokenBeforeTheBody (issue 18, finding 2): on
// both servers a control call without the token whose body holds a 4 MiB
// checkpoint id of NUL bytes is refused 401 unauthorized before its body is
// read (no 422, nothing of it echoed); with the token the same body is a
// 422 whose text is capped at 4 KiB; the owner's session routes cap theirs
// too (a 60 KB cookie). Nothing changes.
func TestControlRoutesCheckTheTokenBeforeTheBody(t *testing.T) {
	e := newEnv(t, options{})
	body, err := json.Marshal(map[string]any{"checkpoint_id": strings.Repeat("\x00", 4<<20), "deadline_ts": deadline(waitLimit)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*controller{e.ctl, e.own} {
		for _, auth := range []string{"", "Bearer nope"} {
			r := c.raw(t, "prepare", auth, string(body))
			wantCapped(t, r, http.StatusUnauthorized, gym.CodeUnauthorized)
			if bytes.Contains(r.body, []byte(`\u0000`)) || bytes.Contains(r.body, []byte(`\x00`)) {
				t.Errorf("%s: the refusal echoes the body: %.300s", r.call, r.body)
			}
		}
		wantCapped(t, c.call(t, "prepare", string(body)), http.StatusUnprocessableEntity, gym.CodeInvalidRequest)
		if s := c.status(t); s.Phase != gym.PhaseIdle {
			t.Errorf("%s status after the refused prepares: %+v", c.name, s)
		}
	}
	huge := strings.Repeat("c", 60<<10)
	for _, path := range []string{"/sandbox_access", "/ng-rollout/" + e.rollout("x") + "/verify"} {
		r, _ := e.ownerCall(t, path, map[string]string{lending.CookieName: huge}, map[string]any{})
		wantCapped(t, r, http.StatusUnauthorized, gym.CodeUnauthorized)
	}
}

// ownerCall posts body to a session route of the owner with the cookies,
// and returns its answer and the cookies it set.
func (e *env) ownerCall(t *testing.T, path string, cookies map[string]string, body any) (ctlReply, map[string]string) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, e.ownerURL+path, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range cookies {
		req.AddCookie(&http.Cookie{Name: k, Value: v})
	}
	resp, err := (&http.Client{Timeout: waitLimit}).Do(req)
	if err != nil {
		t.Fatalf("owner %s: %v", path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	set := map[string]string{}
	for _, c := range resp.Cookies() {
		set[c.Name] = c.Value
	}
	return ctlReply{call: "owner " + path, status: resp.StatusCode, body: out}, set
}

// TestMetricsHaveRuntimeAndProcessFigures (issue 18, finding 12): GET
// /metrics of serve and of owner serve (no token needed on either) holds
// the Go runtime's figures (go_goroutines) and the process's
// (process_resident_memory_bytes, process_open_fds), and the owner's counts
// its session calls.
func TestMetricsHaveRuntimeAndProcessFigures(t *testing.T) {
	e := newEnv(t, options{})
	seed, _ := e.ownerCall(t, httpowner.RolloutPath(e.rollout("m"), "seed_session"), nil, map[string]any{})
	if seed.status != http.StatusOK {
		t.Fatalf("%s", seed)
	}
	for name, url := range map[string]string{"serve": e.ctl.url, "owner serve": e.ownerURL} {
		m, err := scrapeURL(url)
		if err != nil {
			t.Errorf("%s: GET /metrics: %v", name, err)
			continue
		}
		for _, series := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds"} {
			if v, ok := m.sum(series); !ok || v <= 0 {
				t.Errorf("%s: /metrics has %s = %v (found %v), want a positive figure", name, series, v, ok)
			}
		}
	}
	m, err := scrapeURL(e.ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := m.sum("ngdriver_owner_http_requests_total", `route="seed_session"`, `code="200"`); n != 1 {
		t.Errorf("the owner counted %v seeds, want 1", n)
	}
}

// TestARunRestoredAtItsSeedStartsAfreshOnTheOwner (issue 18, finding 1):
// the driver's path after a restore still works when the checkpoint caught
// a run before its seed reply while the owner had seeded its session (Gym
// prepares agents first and a seed is a replay step): the owner's record
// restores that session under attempt 1, the driver's record is at its seed
// bookmark with no cookie, and the replacement /run of attempt 1 seeds
// again without one. It gets a fresh session (the restored one's cookie is
// never handed out) and returns a verified result; the restored session's
// cookie acts on nothing after.
func TestARunRestoredAtItsSeedStartsAfreshOnTheOwner(t *testing.T) {
	const steps = 3
	e := newEnv(t, options{steps: steps})
	id := e.rollout("seeded")
	body := e.body(id, steps, 0.05)

	// The owner's half: the session seeded, then committed.
	seed, cookies := e.ownerCall(t, httpowner.RolloutPath(id, "seed_session"), nil, body)
	if seed.status != http.StatusOK || cookies[lending.CookieName] == "" {
		t.Fatalf("%s (cookies %v)", seed, cookies)
	}
	ckID := e.prefix + "-ck"
	dir := filepath.Join(e.dir, "checkpoints", ckID)
	e.prepareOwner(ckID)
	_, owned := e.commitOwner(ckID, dir, episodes(id), false)
	if _, ok := owned[id]; !ok {
		t.Fatalf("the owner exported %v, want %s", owned, id)
	}
	e.own.must(t, "resume", plainBody(ckID), nil)
	// The driver's half: the run at its seed bookmark.
	writeRecords(t, dir, ckID, seedRecord(id, 0))

	rid := e.prefix + "-restore"
	e.crashDriver()
	e.startDriver()
	e.ctl.must(t, "restore", restoreBody(rid, dir, episodes(id)), nil)
	e.restoreOwner(rid, dir, episodes(id), ckID, owned)
	e.resumeAll(rid)

	res := postRun(t.Context(), e.ctl.url, "/run", id, withAttempt(body, 1)).result(t)
	if res.Reward != 1 || len(res.Launches) != 1 {
		t.Fatalf("the replacement run of %s: reward %v, launches %+v", id, res.Reward, res.Launches)
	}
	restored := owned[id].SessionID
	if strings.Contains(res.Launches[0].SandboxID, restored) {
		t.Errorf("the replacement run ran in %s, a sandbox of the restored session %s", res.Launches[0].SandboxID, restored)
	}
	r, _ := e.ownerCall(t, httpowner.RolloutPath(id+"-a1", "sandbox_access"), cookies, map[string]any{})
	wantRefused(t, r, http.StatusUnauthorized, gym.CodeUnauthorized)
}

// TestSessionRoutesAnswerOnlyTheirCookie (issue 18, finding 1), over the
// real `owner serve`: two rollouts seed a session each; a call on the
// first's key to sandbox_access, verify or close_session without a cookie,
// with a made-up secret, or with the second's cookie is refused (401 or 403
// in Gym's envelope) and changes nothing: the first's own cookie then
// still gets its sandbox, its session open, and its verify still grades it.
func TestSessionRoutesAnswerOnlyTheirCookie(t *testing.T) {
	e := newEnv(t, options{})
	a, b := e.rollout("mine"), e.rollout("theirs")
	seedA, cookiesA := e.ownerCall(t, httpowner.RolloutPath(a, "seed_session"), nil, e.body(a, 1, 0.01))
	seedB, cookiesB := e.ownerCall(t, httpowner.RolloutPath(b, "seed_session"), nil, e.body(b, 1, 0.01))
	if seedA.status != http.StatusOK || seedB.status != http.StatusOK || cookiesA[lending.CookieName] == "" || cookiesB[lending.CookieName] == "" {
		t.Fatalf("seeds: %s (cookies %v); %s (cookies %v)", seedA, cookiesA, seedB, cookiesB)
	}
	id, _, _ := strings.Cut(cookiesA[lending.CookieName], ".")
	strangers := map[string]map[string]string{
		"no cookie":            nil,
		"a made-up secret":     {lending.CookieName: id + "." + strings.Repeat("0", 64)},
		"the other's cookie":   cookiesB,
		"the session id alone": {lending.CookieName: id},
	}
	for _, route := range []string{"sandbox_access", "verify", "close_session"} {
		for who, cookies := range strangers {
			r, _ := e.ownerCall(t, httpowner.RolloutPath(a, route), cookies, map[string]any{})
			if r.status != http.StatusUnauthorized && r.status != http.StatusForbidden || r.errorText() == "" {
				t.Errorf("%s with %s: %s, want 401 or 403 in Gym's envelope", route, who, r)
			}
			if bytes.Contains(r.body, []byte("sandbox_id")) || bytes.Contains(r.body, []byte(`"reward"`)) {
				t.Errorf("%s with %s answered what only the session's holder may read: %.300s", route, who, r.body)
			}
		}
	}
	if r, _ := e.ownerCall(t, httpowner.RolloutPath(a, "sandbox_access"), cookiesA, map[string]any{}); r.status != http.StatusOK || !bytes.Contains(r.body, []byte("sandbox_id")) {
		t.Errorf("the session's own cookie after the refused calls: %s", r)
	}
	if r, _ := e.ownerCall(t, httpowner.RolloutPath(a, "verify"), cookiesA, map[string]any{}); r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"reward"`)) {
		t.Errorf("the session's own verify after the refused calls: %s", r)
	}
}
