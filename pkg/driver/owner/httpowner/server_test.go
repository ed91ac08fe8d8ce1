package httpowner_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/httpowner"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/gym"
)

// The tests below run the owner as `ngdriver owner serve` does: a local
// owner on a local backend behind httpowner.Server, over real HTTP on
// loopback, with Gym's control routes. Several port cases of Gym's own
// resources participant tests (tests/unit_tests of NVIDIA-NeMo/Gym, the
// resources checkpoint tests); each names the case it ports.

const (
	token    = "t"
	instance = "ngdriver_owner"
)

// server is one owner process: its backend on base, its owner and its
// HTTP server. A second server on the same base is a fresh process that
// shares only the disk.
type server struct {
	t   *testing.T
	b   *local.Backend
	own *lending.Owner
	url string
}

func newServer(t *testing.T, base string) *server {
	t.Helper()
	b, err := local.New(base, local.Options{Isolation: local.IsolationNone})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	own := lending.New(lending.Options{Backend: b, Logger: log})
	control, err := owner.NewControl(own, gym.Config{Instance: instance, LeaseGrace: time.Minute, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	srv := &httpowner.Server{Owner: own, Control: control, Token: token, Log: log, ClientError: lending.ClientError}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &server{t: t, b: b, own: own, url: hs.URL}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// reply is one HTTP answer.
type reply struct {
	status  int
	header  http.Header
	cookies owner.Cookies
	body    map[string]any
	raw     string
}

// code is the error envelope's code ("" when there is none).
func (r reply) code() string {
	e, _ := r.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// post sends body (JSON-encoded unless it is a string) to path with the
// cookies; control routes get the bearer token.
func (s *server) post(path string, c owner.Cookies, body any) reply {
	s.t.Helper()
	return s.do(http.MethodPost, path, c, body)
}

func (s *server) do(method, path string, c owner.Cookies, body any) reply {
	s.t.Helper()
	var data []byte
	switch b := body.(type) {
	case nil:
	case string:
		data = []byte(b)
	default:
		var err error
		if data, err = json.Marshal(b); err != nil {
			s.t.Fatal(err)
		}
	}
	req, err := http.NewRequest(method, s.url+path, bytes.NewReader(data))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if strings.HasPrefix(path, gym.RoutePrefix) {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range c {
		req.AddCookie(&http.Cookie{Name: k, Value: v})
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, cookies: owner.Cookies{}, raw: string(raw)}
	for _, ck := range resp.Cookies() {
		r.cookies[ck.Name] = ck.Value
	}
	_ = json.Unmarshal(raw, &r.body)
	return r
}

// control posts a checkpoint operation with a deadline in timeout.
func (s *server) control(op, checkpointID string, timeout time.Duration, extra map[string]any) reply {
	s.t.Helper()
	body := map[string]any{"checkpoint_id": checkpointID, "deadline_ts": float64(time.Now().Add(timeout).UnixNano()) / 1e9}
	for k, v := range extra {
		body[k] = v
	}
	return s.post(gym.RoutePrefix+"/"+op, nil, body)
}

func (s *server) status() reply {
	s.t.Helper()
	return s.do(http.MethodGet, gym.RoutePrefix+"/status", nil, nil)
}

// counts is the status report's counts.
func (s *server) counts() map[string]any {
	s.t.Helper()
	report, _ := s.status().body["report"].(map[string]any)
	counts, _ := report["counts"].(map[string]any)
	return counts
}

func (s *server) seed(key string, body map[string]any) reply {
	s.t.Helper()
	return s.post(httpowner.RolloutPath(key, "seed_session"), nil, body)
}

// seedWith seeds key carrying the cookies c, as a caller continuing a
// session does.
func (s *server) seedWith(key string, c owner.Cookies, body map[string]any) reply {
	s.t.Helper()
	return s.post(httpowner.RolloutPath(key, "seed_session"), c, body)
}

func (s *server) mustSeed(key string, body map[string]any) reply {
	s.t.Helper()
	r := s.seed(key, body)
	if r.status != http.StatusOK || r.cookies[lending.CookieName] == "" {
		s.t.Fatalf("seed %s: %d %s (cookies %v)", key, r.status, r.raw, r.cookies)
	}
	return r
}

// want fails unless r has the status and (when code is set) the envelope code.
func want(t *testing.T, what string, r reply, status int, code string) {
	t.Helper()
	if r.status != status || r.code() != code {
		t.Fatalf("%s: got %d %s, want %d %q", what, r.status, r.raw, status, code)
	}
}

// ok fails unless r is a 200.
func ok(t *testing.T, what string, r reply) reply {
	t.Helper()
	want(t, what, r, http.StatusOK, "")
	return r
}

// hostFile reads a file of a sandbox's workdir from the host.
func (s *server) hostFile(sandboxID, name string) string {
	s.t.Helper()
	sb, err := s.b.Open(sandboxID)
	if err != nil {
		s.t.Fatalf("open sandbox %s: %v", sandboxID, err)
	}
	host, err := sb.HostPathOf(filepath.Join(sb.Workdir(), name))
	if err != nil {
		s.t.Fatal(err)
	}
	data, err := os.ReadFile(host)
	if err != nil {
		s.t.Fatal(err)
	}
	return string(data)
}

// writeFile writes a file into a sandbox's workdir, as a run would.
func (s *server) writeFile(sandboxID, name, content string) {
	s.t.Helper()
	sb, err := s.b.Open(sandboxID)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := sb.Upload(s.t.Context(), filepath.Join(sb.Workdir(), name), []byte(content), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

func (s *server) exists(sandboxID string) bool {
	_, err := s.b.Open(sandboxID)
	if err != nil && !errors.Is(err, sandbox.ErrGone) {
		s.t.Fatal(err)
	}
	return err == nil
}

// sandboxes lists the sandboxes on the backend's disk.
func sandboxes(t *testing.T, base string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(base, "sandboxes"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func handle(t *testing.T, r reply) string {
	t.Helper()
	h, _ := r.body["sandbox_handle"].(string)
	if h == "" {
		t.Fatalf("seed reply %s has no sandbox_handle", r.raw)
	}
	return h
}

func episodes(ids ...string) []map[string]any {
	out := []map[string]any{}
	for _, key := range ids {
		id, err := gym.ParseCaptureKey(key)
		if err != nil {
			panic(err)
		}
		out = append(out, map[string]any{"rollout_id": id.RolloutID, "attempt": id.Attempt})
	}
	return out
}

// commit prepares and commits checkpointID into dir.
func (s *server) commit(checkpointID, dir string, extra map[string]any) reply {
	s.t.Helper()
	p := ok(s.t, "prepare", s.control("prepare", checkpointID, 10*time.Second, nil))
	if p.body["phase"] != "prepared" {
		s.t.Fatalf("prepare: %s", p.raw)
	}
	if extra == nil {
		extra = map[string]any{}
	}
	extra["checkpoint_dir"] = dir
	return ok(s.t, "commit", s.control("commit", checkpointID, 30*time.Second, extra))
}

func TestStatusDiscovery(t *testing.T) {
	s := newServer(t, t.TempDir())
	st := ok(t, "status", s.status())
	if st.body["kind"] != "resources" || st.body["instance"] != instance || st.body["phase"] != "idle" || st.body["mode"] != "exported" {
		t.Fatalf("status %s", st.raw)
	}
	req, _ := http.NewRequest(http.MethodGet, s.url+gym.RoutePrefix+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status without the token: %d, want 401", resp.StatusCode)
	}

	// Without a token the owner is not a participant: the routes are not there.
	b, err := local.New(t.TempDir(), local.Options{Isolation: local.IsolationNone})
	if err != nil {
		t.Fatal(err)
	}
	own := lending.New(lending.Options{Backend: b})
	control, err := owner.NewControl(own, gym.Config{Instance: instance})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer((&httpowner.Server{Owner: own, Control: control}).Handler())
	defer hs.Close()
	resp, err = http.Get(hs.URL + gym.RoutePrefix + "/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status of an owner without a token: %d, want 404", resp.StatusCode)
	}
}

// TestASeedOfAnExistingKeyAnswersOnlyWithItsCookie: the /ng-rollout/<key>/
// prefix binds the session; a seed repeated for the key with the session's
// cookie answers the same session, one without it is refused and hands out
// nothing (no cookie, no sandbox), one after it closed is refused, and
// calls without a key still work by cookie.
func TestASeedOfAnExistingKeyAnswersOnlyWithItsCookie(t *testing.T) {
	s := newServer(t, t.TempDir())
	first := s.mustSeed("r", map[string]any{"files": map[string]string{"a.txt": "one"}})
	again := ok(t, "seed again with the cookie", s.seedWith("r", first.cookies, map[string]any{"files": map[string]string{"a.txt": "one"}}))
	if again.cookies[lending.CookieName] != first.cookies[lending.CookieName] || handle(t, again) != handle(t, first) {
		t.Fatalf("the second seed of r answered %v %s, the first %v %s", again.cookies, again.raw, first.cookies, first.raw)
	}
	stranger := s.seed("r", map[string]any{})
	want(t, "a seed of r without its cookie", stranger, http.StatusUnauthorized, gym.CodeUnauthorized)
	if len(stranger.cookies) > 0 || strings.Contains(stranger.raw, handle(t, first)) || strings.Contains(stranger.raw, lending.SessionIDOf(first.cookies)) {
		t.Fatalf("a seed without the cookie was told %v %s", stranger.cookies, stranger.raw)
	}
	other := s.mustSeed("r-a1", map[string]any{})
	if other.cookies[lending.CookieName] == first.cookies[lending.CookieName] {
		t.Fatal("attempt 1 got attempt 0's session")
	}
	acc := ok(t, "sandbox_access", s.post("/ng-rollout/r/sandbox_access", first.cookies, map[string]any{}))
	conn, _ := acc.body["connection"].(map[string]any)
	desc, _ := conn["descriptor"].(map[string]any)
	if conn["kind"] != "direct" || conn["provider_config_ref"] != "local" || desc["sandbox_id"] != handle(t, first) || acc.body["workdir"] == "" {
		t.Fatalf("sandbox_access %s", acc.raw)
	}
	closed := ok(t, "close", s.post("/ng-rollout/r/close_session", first.cookies, map[string]any{}))
	if closed.raw != "{}" {
		t.Fatalf("close_session answered %s, want {}", closed.raw)
	}
	ok(t, "close again", s.post("/ng-rollout/r/close_session", first.cookies, map[string]any{}))
	want(t, "seed of a closed session's key", s.seedWith("r", first.cookies, map[string]any{}), http.StatusGone, httpowner.CodeSessionClosed)
	want(t, "seed of a closed session's key without its cookie", s.seed("r", map[string]any{}), http.StatusUnauthorized, gym.CodeUnauthorized)

	legacy := ok(t, "seed without a key", s.post("/seed_session", nil, map[string]any{}))
	if legacy.cookies[lending.CookieName] == "" {
		t.Fatalf("seed without a key set no cookie: %s", legacy.raw)
	}
	ok(t, "sandbox_access without a key", s.post("/sandbox_access", legacy.cookies, map[string]any{}))
}

// TestSeededSessionStateIsCommittedAndRestored ports
// test_seeded_session_state_is_committed_and_restored: the commit writes
// the manifest and a record per session; a fresh owner process on the
// same disk restores them, a call before resume waits for it, and the
// next attempt's seed answers the fork holding the snapshot's files.
func TestSeededSessionStateIsCommittedAndRestored(t *testing.T) {
	base, dir := t.TempDir(), t.TempDir()
	s := newServer(t, base)
	seeded := s.mustSeed("r", map[string]any{"files": map[string]string{"a.txt": "one"}, "check": "test \"$(cat a.txt)\" = two"})
	sb := handle(t, seeded)
	s.writeFile(sb, "a.txt", "two")
	commit := s.commit("c1", dir, nil)
	if ids, _ := commit.body["episode_ids"].([]any); len(ids) != 1 || ids[0] != "r" {
		t.Fatalf("commit %s", commit.raw)
	}
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
	s.writeFile(sb, "a.txt", "after the checkpoint")

	participant := filepath.Join(dir, "gym", "resources", instance)
	var manifest map[string]any
	data, err := os.ReadFile(filepath.Join(participant, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &manifest); err != nil || manifest["kind"] != "resources" || manifest["record_count"] != float64(1) {
		t.Fatalf("manifest %s (%v)", data, err)
	}
	var rec lending.Record
	if _, err := gym.ReadState(dir, gym.KindResources, instance, func(r gym.Record) error { return r.Decode(&rec) }); err != nil {
		t.Fatal(err)
	}
	if rec.SessionID != lending.SessionIDOf(seeded.cookies) || rec.State.Snapshot == "" || rec.State.SandboxID != sb || rec.EpisodeID.CaptureKey() != "r" ||
		strings.Contains(string(data), seeded.cookies[lending.CookieName]) {
		t.Fatalf("record %+v", rec)
	}

	fresh := newServer(t, base)
	restore := ok(t, "restore", fresh.control("restore", "r1", 30*time.Second, map[string]any{"checkpoint_dir": dir, "episode_ids": episodes("r", "r-a1")}))
	if got, _ := restore.body["restored"].([]any); len(got) != 1 || got[0] != "r-a1" {
		t.Fatalf("restore %s", restore.raw)
	}
	st := fresh.status().body
	if report, _ := st["report"].(map[string]any); report["counts"].(map[string]any)["sessions"] != float64(1) {
		t.Fatalf("status after restore %v", st)
	}
	// A call before resume waits for it instead of being refused. The
	// caller continues with the cookie it kept across the crash.
	seeding := make(chan reply, 1)
	go func() {
		seeding <- fresh.seedWith("r-a1", seeded.cookies, map[string]any{"files": map[string]string{"a.txt": "one"}})
	}()
	select {
	case r := <-seeding:
		t.Fatalf("a seed before resume answered %d %s", r.status, r.raw)
	case <-time.After(300 * time.Millisecond):
	}
	ok(t, "resume", fresh.control("resume", "r1", 5*time.Second, nil))
	again := ok(t, "seed of r-a1", <-seeding)
	if again.cookies[lending.CookieName] != seeded.cookies[lending.CookieName] {
		t.Fatalf("the seed of r-a1 set %v, want the restored session's %v", again.cookies, seeded.cookies)
	}
	fork := handle(t, again)
	if fork == sb || !strings.HasPrefix(fork, "sb-"+rec.SessionID+"-") {
		t.Fatalf("the restored session's sandbox is %s (exported from %s)", fork, sb)
	}
	if got := fresh.hostFile(fork, "a.txt"); got != "two" {
		t.Fatalf("the fork holds a.txt %q, want the snapshot's \"two\"", got)
	}
	acc := ok(t, "sandbox_access", fresh.post("/ng-rollout/r-a1/sandbox_access", again.cookies, map[string]any{}))
	if acc.body["connection"].(map[string]any)["descriptor"].(map[string]any)["sandbox_id"] != fork {
		t.Fatalf("sandbox_access %s, want %s", acc.raw, fork)
	}
	v := ok(t, "verify", fresh.post("/ng-rollout/r-a1/verify", again.cookies, map[string]any{"response": map[string]any{}}))
	if v.body["reward"] != float64(1) {
		t.Fatalf("verify on the fork: %s", v.raw)
	}
	if got := fresh.counts()["sessions"]; got != float64(0) {
		t.Fatalf("sessions after verify: %v", got)
	}
}

// TestLateCallsOfARetiredAttemptAreRefusedUntilForgetButACloseIsNot ports
// test_late_requests_of_a_retired_attempt_are_refused_until_forget_but_a_close_is_not.
func TestLateCallsOfARetiredAttemptAreRefusedUntilForgetButACloseIsNot(t *testing.T) {
	s := newServer(t, t.TempDir())
	seeded := s.mustSeed("r", map[string]any{})
	sb := handle(t, seeded)
	retired := ok(t, "retire", s.control("retire", "retire", 10*time.Second, map[string]any{"episode_ids": episodes("r")}))
	if got, _ := retired.body["retired"].([]any); len(got) != 1 || got[0] != "r" {
		t.Fatalf("retire %s", retired.raw)
	}
	if s.exists(sb) {
		t.Fatalf("the retired attempt's sandbox %s is still there", sb)
	}
	want(t, "a late call with the cookie only", s.post("/sandbox_access", seeded.cookies, map[string]any{}), http.StatusConflict, gym.CodeStaleAttempt)
	want(t, "a late verify", s.post("/ng-rollout/r/verify", seeded.cookies, map[string]any{}), http.StatusConflict, gym.CodeStaleAttempt)
	want(t, "a late seed", s.seed("r", map[string]any{}), http.StatusConflict, gym.CodeStaleAttempt)
	ok(t, "close", s.post("/ng-rollout/r/close_session", seeded.cookies, map[string]any{}))
	next := s.mustSeed("r-a1", map[string]any{})
	st := ok(t, "status", s.status())
	if st.body["retired_sessions"] != float64(1) || st.body["retired_rollouts"] != float64(1) {
		t.Fatalf("status %s", st.raw)
	}
	ok(t, "forget", s.control("forget", "forget", 10*time.Second, map[string]any{"rollout_ids": []string{"r"}}))
	if st := ok(t, "status", s.status()); st.body["retired_sessions"] != float64(0) {
		t.Fatalf("status after forget %s", st.raw)
	}
	want(t, "a late call after forget", s.post("/sandbox_access", seeded.cookies, map[string]any{}), http.StatusGone, httpowner.CodeSessionClosed)
	after := s.mustSeed("r", map[string]any{})
	if after.cookies[lending.CookieName] == seeded.cookies[lending.CookieName] || after.cookies[lending.CookieName] == next.cookies[lending.CookieName] {
		t.Fatal("the seed after forget did not start a new session")
	}
}

// TestARetireWaitsForTheSessionsCallInFlight ports
// test_a_retire_waits_for_the_sessions_request_in_flight, with a verify
// whose check runs until the test lets it end.
func TestARetireWaitsForTheSessionsCallInFlight(t *testing.T) {
	s := newServer(t, t.TempDir())
	seeded := s.mustSeed("r", map[string]any{"check": "while [ ! -f release ]; do sleep 0.02; done"})
	sb := handle(t, seeded)
	verifying := make(chan reply, 1)
	go func() { verifying <- s.post("/ng-rollout/r/verify", seeded.cookies, map[string]any{}) }()
	testkit.Eventually(t, "the verify in flight", func() (bool, string) { return s.counts()["inflight"] == float64(1), "" })
	retiring := make(chan reply, 1)
	go func() {
		retiring <- s.control("retire", "retire", 30*time.Second, map[string]any{"episode_ids": episodes("r")})
	}()
	testkit.Eventually(t, "the retire's mark", func() (bool, string) { return s.status().body["retired_sessions"] == float64(1), "" })
	select {
	case r := <-retiring:
		t.Fatalf("the retire answered %d %s while a call was in flight", r.status, r.raw)
	default:
	}
	want(t, "a new call while it stops", s.post("/sandbox_access", seeded.cookies, map[string]any{}), http.StatusConflict, gym.CodeStaleAttempt)
	s.writeFile(sb, "release", "")
	ok(t, "verify", <-verifying)
	ok(t, "retire", <-retiring)
	if s.exists(sb) || s.counts()["sessions"] != float64(0) {
		t.Fatalf("after the retire: sandbox there %v, counts %v", s.exists(sb), s.counts())
	}
}

// TestInFlightVerifyBlocksPrepareAndVerifyEndsTheSession ports
// test_in_flight_request_blocks_prepare_and_verify_ends_the_session: a
// verify in wait mode holds up prepare.
func TestInFlightVerifyBlocksPrepareAndVerifyEndsTheSession(t *testing.T) {
	s := newServer(t, t.TempDir())
	seeded := s.mustSeed("r", map[string]any{"check": "while [ ! -f release ]; do sleep 0.02; done"})
	verifying := make(chan reply, 1)
	go func() { verifying <- s.post("/ng-rollout/r/verify", seeded.cookies, map[string]any{}) }()
	testkit.Eventually(t, "the verify in flight", func() (bool, string) { return s.counts()["inflight"] == float64(1), "" })
	missed := ok(t, "prepare", s.control("prepare", "c1", 300*time.Millisecond, nil))
	report, _ := missed.body["report"].(map[string]any)
	if missed.body["phase"] != "preparing" || fmt.Sprint(report["counts"]) != "map[inflight:1 sessions:1]" {
		t.Fatalf("prepare with a verify in flight: %s", missed.raw)
	}
	s.writeFile(handle(t, seeded), "release", "")
	ok(t, "verify", <-verifying)
	prepared := ok(t, "prepare", s.control("prepare", "c1", 10*time.Second, nil))
	if prepared.body["phase"] != "prepared" {
		t.Fatalf("prepare after the verify: %s", prepared.raw)
	}
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
	if got := s.counts()["sessions"]; got != float64(0) {
		t.Fatalf("sessions after verify: %v", got)
	}
}

// TestARestartSessionIsARestartThatKeepsRunningThroughACheckpoint ports
// test_a_restart_only_session_is_a_restart_that_keeps_running_through_a_checkpoint,
// for a session whose run body asks to restart (and one with no sandbox).
func TestARestartSessionIsARestartThatKeepsRunningThroughACheckpoint(t *testing.T) {
	s := newServer(t, t.TempDir())
	dir := t.TempDir()
	seeded := s.mustSeed("r-a2", map[string]any{"restart": true})
	if seeded.header.Get(httpowner.HeaderRestart) != "1" {
		t.Fatalf("the seed reply of a restart has headers %v", seeded.header)
	}
	s.mustSeed("q", map[string]any{"no_sandbox": true})
	prepared := ok(t, "prepare", s.control("prepare", "c1", 10*time.Second, nil))
	report, _ := prepared.body["report"].(map[string]any)
	if prepared.body["phase"] != "prepared" || fmt.Sprint(report["restarts"]) != "[q r-a2]" || fmt.Sprint(report["blockers"]) != "[]" {
		t.Fatalf("prepare %s", prepared.raw)
	}
	// Nothing of it is in the checkpoint, so it keeps running through it.
	ok(t, "sandbox_access during the checkpoint", s.post("/ng-rollout/r-a2/sandbox_access", seeded.cookies, map[string]any{}))
	want(t, "commit naming the restart", s.control("commit", "c1", 10*time.Second,
		map[string]any{"checkpoint_dir": dir, "episode_ids": episodes("r-a2")}), http.StatusConflict, gym.CodeRestartInScope)
	committed := ok(t, "commit", s.control("commit", "c1", 10*time.Second, map[string]any{"checkpoint_dir": dir, "episode_ids": episodes()}))
	if committed.body["manifest"].(map[string]any)["record_count"] != float64(0) {
		t.Fatalf("commit %s", committed.raw)
	}
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
}

// TestASeedArrivingDuringAnOpenCheckpointWaitsForResume ports
// test_a_seed_arriving_during_an_open_checkpoint_waits_for_resume.
func TestASeedArrivingDuringAnOpenCheckpointWaitsForResume(t *testing.T) {
	s := newServer(t, t.TempDir())
	dir := t.TempDir()
	if p := ok(t, "prepare", s.control("prepare", "c1", 10*time.Second, nil)); p.body["phase"] != "prepared" {
		t.Fatalf("prepare %s", p.raw)
	}
	seeding := make(chan reply, 1)
	go func() { seeding <- s.seed("r", map[string]any{}) }()
	select {
	case r := <-seeding:
		t.Fatalf("a seed during the checkpoint answered %d %s", r.status, r.raw)
	case <-time.After(300 * time.Millisecond):
	}
	commit := ok(t, "commit", s.control("commit", "c1", 10*time.Second, map[string]any{"checkpoint_dir": dir}))
	if commit.body["manifest"].(map[string]any)["record_count"] != float64(0) {
		t.Fatalf("commit %s", commit.raw)
	}
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
	ok(t, "the seed after resume", <-seeding)
	if p := ok(t, "prepare", s.control("prepare", "c2", 10*time.Second, nil)); p.body["phase"] != "prepared" {
		t.Fatalf("prepare after resume: %s", p.raw)
	}
	ok(t, "resume", s.control("resume", "c2", 5*time.Second, nil))
}

// TestACommitWithStopRemovesTheExportedSandboxes: with stop, once the
// records are durable the sandboxes are removed; the snapshots stay and a
// fresh owner rebuilds the sessions from them.
func TestACommitWithStopRemovesTheExportedSandboxes(t *testing.T) {
	base, dir := t.TempDir(), t.TempDir()
	s := newServer(t, base)
	a := s.mustSeed("a", map[string]any{"files": map[string]string{"f": "A"}})
	b := s.mustSeed("b", map[string]any{"files": map[string]string{"f": "B"}})
	commit := s.commit("c1", dir, map[string]any{"stop": true})
	if fmt.Sprint(commit.body["episode_ids"]) != "[a b]" {
		t.Fatalf("commit %s", commit.raw)
	}
	if s.exists(handle(t, a)) || s.exists(handle(t, b)) {
		t.Fatalf("sandboxes left after a commit with stop: %v", sandboxes(t, base))
	}
	// The controller stops this process now; if it resumed instead, the
	// parked sessions would refuse their calls.
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
	want(t, "a call on a parked session", s.post("/sandbox_access", a.cookies, map[string]any{}), http.StatusConflict, gym.CodeCheckpointParked)

	fresh := newServer(t, base)
	ok(t, "restore", fresh.control("restore", "r1", 30*time.Second, map[string]any{"checkpoint_dir": dir, "episode_ids": episodes("a", "b")}))
	ok(t, "resume", fresh.control("resume", "r1", 5*time.Second, nil))
	for key, c := range map[string]struct {
		seeded reply
		want   string
	}{"a-a1": {a, "A"}, "b-a1": {b, "B"}} {
		seeded := ok(t, "seed "+key, fresh.seedWith(key, c.seeded.cookies, map[string]any{}))
		if got := fresh.hostFile(handle(t, seeded), "f"); got != c.want {
			t.Fatalf("%s: f is %q, want %q", key, got, c.want)
		}
	}
}

// TestInvalidRestoredStateInstallsNothing ports
// test_invalid_restored_state_installs_nothing: a checkpoint with one bad
// record (its snapshot is missing, or it names another provider) installs
// none, leaves no fork behind and the owner idle.
func TestInvalidRestoredStateInstallsNothing(t *testing.T) {
	base, dir := t.TempDir(), t.TempDir()
	s := newServer(t, base)
	s.mustSeed("good", map[string]any{"files": map[string]string{"f": "G"}})
	s.commit("c1", dir, nil)
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
	var good gym.Record
	if _, err := gym.ReadState(dir, gym.KindResources, instance, func(r gym.Record) error { good = r; return nil }); err != nil {
		t.Fatal(err)
	}
	var rec lending.Record
	if err := good.Decode(&rec); err != nil {
		t.Fatal(err)
	}

	for name, spoil := range map[string]func(*lending.Record){
		"missing snapshot": func(r *lending.Record) { r.State.Snapshot = "ck-gone" },
		"other provider":   func(r *lending.Record) { r.State.Provider = "docker" },
		"bad run body":     func(r *lending.Record) { r.State.RunBody = json.RawMessage(`{"files": 3}`) },
	} {
		t.Run(name, func(t *testing.T) {
			bad := rec
			bad.EpisodeID, bad.SessionID = gym.EpisodeID{RolloutID: "bad"}, "0123456789abcdef01234567"
			spoil(&bad)
			badRec, err := gym.NewRecord(bad)
			if err != nil {
				t.Fatal(err)
			}
			// good first: its fork is made before the bad one fails.
			bdir := t.TempDir()
			if _, err := gym.WriteState(bdir, gym.KindResources, instance, "c-bad", []gym.Record{good, badRec}, nil, &gym.WriteStop{}); err != nil {
				t.Fatal(err)
			}
			before := sandboxes(t, base)
			fresh := newServer(t, base)
			refused := fresh.control("restore", "r-"+strings.ReplaceAll(name, " ", "-"), 30*time.Second,
				map[string]any{"checkpoint_dir": bdir, "episode_ids": episodes("good", "bad")})
			want(t, "restore with a bad record", refused, http.StatusUnprocessableEntity, gym.CodeCheckpointState)
			if !strings.Contains(refused.raw, `\"bad\"`) && !strings.Contains(refused.raw, "bad") {
				t.Fatalf("the refusal does not name the bad episode: %s", refused.raw)
			}
			if after := sandboxes(t, base); !slices.Equal(before, after) {
				t.Fatalf("sandboxes before %v, after the failed restore %v", before, after)
			}
			st := ok(t, "status", fresh.status())
			if st.body["phase"] != "idle" || fresh.counts()["sessions"] != float64(0) {
				t.Fatalf("status after the failed restore %s", st.raw)
			}
			// Nothing installed: the next attempt's seed starts fresh.
			if got := fresh.mustSeed("good-a1", map[string]any{}); got.cookies[lending.CookieName] == rec.SessionID {
				t.Fatal("the seed of good-a1 found a restored session")
			}
		})
	}
}

// TestACommitThatNoLongerContinuesARestoredSessionRetiresIt ports
// test_a_commit_that_no_longer_continues_a_restored_session_retires_it.
func TestACommitThatNoLongerContinuesARestoredSessionRetiresIt(t *testing.T) {
	base, dir := t.TempDir(), t.TempDir()
	s := newServer(t, base)
	s.mustSeed("r", map[string]any{})
	s.commit("c1", filepath.Join(dir, "first"), nil)

	fresh := newServer(t, base)
	ok(t, "restore", fresh.control("restore", "r1", 30*time.Second, map[string]any{"checkpoint_dir": filepath.Join(dir, "first"), "episode_ids": episodes("r")}))
	ok(t, "resume", fresh.control("resume", "r1", 5*time.Second, nil))
	pending, err := fresh.own.RestoredPending(t.Context())
	if err != nil || len(pending) != 1 || pending[0].CaptureKey() != "r-a1" {
		t.Fatalf("restored pending %v %v", pending, err)
	}
	forks := sandboxes(t, base)
	committed := fresh.commit("c2", filepath.Join(dir, "second"), map[string]any{"episode_ids": episodes()})
	if fmt.Sprint(committed.body["episode_ids"]) != "[]" {
		t.Fatalf("commit %s", committed.raw)
	}
	ok(t, "resume", fresh.control("resume", "c2", 5*time.Second, nil))
	if got := fresh.counts()["sessions"]; got != float64(0) {
		t.Fatalf("sessions after the commit: %v", got)
	}
	if after := sandboxes(t, base); len(after) != len(forks)-1 {
		t.Fatalf("sandboxes before the commit %v, after %v: the fork should be gone", forks, after)
	}
}

// TestAReplayableVerifyDuringACheckpointKeepsTheSessionExported ports
// test_a_replayable_verify_during_a_checkpoint_keeps_the_session_exported:
// the checkpoint does not wait for a verify that replays, and the session
// it verified is still exported (a restore replays the verify on it); it
// ends at resume.
func TestAReplayableVerifyDuringACheckpointKeepsTheSessionExported(t *testing.T) {
	s := newServer(t, t.TempDir())
	seeded := s.mustSeed("r", map[string]any{"verify_mode": "replay"})
	if seeded.header.Get(httpowner.HeaderVerify) != "replay" {
		t.Fatalf("seed headers %v", seeded.header)
	}
	ok(t, "prepare", s.control("prepare", "c1", 10*time.Second, nil))
	ok(t, "verify during the checkpoint", s.post("/ng-rollout/r/verify", seeded.cookies, map[string]any{}))
	committed := ok(t, "commit", s.control("commit", "c1", 30*time.Second, map[string]any{"checkpoint_dir": t.TempDir()}))
	during := s.counts()["sessions"]
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
	if fmt.Sprint(committed.body["episode_ids"]) != "[r]" || during != float64(1) {
		t.Fatalf("commit %s, sessions during %v", committed.raw, during)
	}
	if got := s.counts()["sessions"]; got != float64(0) {
		t.Fatalf("sessions after resume: %v", got)
	}
	want(t, "a seed after the session ended", s.seedWith("r", seeded.cookies, map[string]any{}), http.StatusGone, httpowner.CodeSessionClosed)
}

// TestASessionWhoseSandboxIsGoneIsNotExportedAndDoesNotFailTheCommit ports
// test_a_session_the_server_already_dropped_is_not_exported_and_does_not_fail_the_commit.
func TestASessionWhoseSandboxIsGoneIsNotExportedAndDoesNotFailTheCommit(t *testing.T) {
	s := newServer(t, t.TempDir())
	seeded := s.mustSeed("r", map[string]any{})
	if err := s.b.Remove(t.Context(), handle(t, seeded)); err != nil {
		t.Fatal(err)
	}
	committed := s.commit("c1", t.TempDir(), nil)
	if committed.body["manifest"].(map[string]any)["record_count"] != float64(0) {
		t.Fatalf("commit %s", committed.raw)
	}
	if got := s.counts()["sessions"]; got != float64(0) {
		t.Fatalf("sessions after the commit: %v", got)
	}
}

// TestACloseDuringACheckpointWaitsForResumeAndThenEndsTheSession ports
// test_a_close_during_a_checkpoint_waits_for_resume_and_then_ends_the_session.
func TestACloseDuringACheckpointWaitsForResumeAndThenEndsTheSession(t *testing.T) {
	s := newServer(t, t.TempDir())
	seeded := s.mustSeed("r", map[string]any{})
	ok(t, "prepare", s.control("prepare", "c1", 10*time.Second, nil))
	closing := make(chan reply, 1)
	go func() { closing <- s.post("/ng-rollout/r/close_session", seeded.cookies, map[string]any{}) }()
	select {
	case r := <-closing:
		t.Fatalf("a close during the checkpoint answered %d %s", r.status, r.raw)
	case <-time.After(300 * time.Millisecond):
	}
	// A waiting close is not in flight: it does not hold up the checkpoint.
	if p := ok(t, "prepare", s.control("prepare", "c1", 10*time.Second, nil)); p.body["phase"] != "prepared" {
		t.Fatalf("prepare %s", p.raw)
	}
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
	ok(t, "close", <-closing)
	if got := s.counts()["sessions"]; got != float64(0) {
		t.Fatalf("sessions after the close: %v", got)
	}
}

// TestASessionWhoseRetireWasCutShortStaysUntilARetryFreesItAndBlocksMeanwhile
// ports test_a_session_whose_retire_was_cut_short_stays_until_a_retry_frees_it_and_blocks_meanwhile:
// here the retire is cut short while it waits for a verify in flight.
func TestASessionWhoseRetireWasCutShortStaysUntilARetryFreesItAndBlocksMeanwhile(t *testing.T) {
	s := newServer(t, t.TempDir())
	seeded := s.mustSeed("r", map[string]any{"check": "while [ ! -f release ]; do sleep 0.02; done"})
	sb := handle(t, seeded)
	verifying := make(chan reply, 1)
	go func() { verifying <- s.post("/ng-rollout/r/verify", seeded.cookies, map[string]any{}) }()
	testkit.Eventually(t, "the verify in flight", func() (bool, string) { return s.counts()["inflight"] == float64(1), "" })
	cut := s.control("retire", "retire", 300*time.Millisecond, map[string]any{"episode_ids": episodes("r")})
	want(t, "a retire cut short", cut, http.StatusConflict, gym.CodeDeadlineExceeded)
	s.writeFile(sb, "release", "")
	ok(t, "verify", <-verifying)
	// The session is still being freed: the next checkpoint waits for it.
	prepared := ok(t, "prepare", s.control("prepare", "c1", 300*time.Millisecond, nil))
	report, _ := prepared.body["report"].(map[string]any)
	if prepared.body["phase"] != "preparing" || fmt.Sprint(report["blockers"]) != "[r]" {
		t.Fatalf("prepare %s", prepared.raw)
	}
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
	ok(t, "retire again", s.control("retire", "retire", 10*time.Second, map[string]any{"episode_ids": episodes("r")}))
	if s.exists(sb) || s.counts()["sessions"] != float64(0) {
		t.Fatalf("after the retry: sandbox there %v, counts %v", s.exists(sb), s.counts())
	}
}

// TestASnapshotLivesWhileACheckpointOnDiskNamesIt proves the owner's rule
// for its snapshots: a snapshot stays while the checkpoint folder its
// commit wrote still holds the manifest naming that checkpoint, and goes
// (at the next commit) once it does not. After five commits of one
// session every snapshot is there (their folders are); the controller then
// deletes the folders of c1 and c2, and the owner's commit of c6 fails (a
// file stands where its folder goes), so c6 never publishes; at c7 the
// snapshots of c1, c2 and c6 are removed, those of c3, c4, c5 and c7 kept,
// and c3 still restores in a fresh owner.
func TestASnapshotLivesWhileACheckpointOnDiskNamesIt(t *testing.T) {
	base := t.TempDir()
	s := newServer(t, base)
	s.mustSeed("keep", map[string]any{"files": map[string]string{"a.txt": "one"}})
	dirs, snaps := map[string]string{}, map[string]string{}
	commit := func(id string) {
		t.Helper()
		dirs[id] = t.TempDir()
		s.commit(id, dirs[id], nil)
		ok(t, "resume", s.control("resume", id, 5*time.Second, nil))
		var rec lending.Record
		if _, err := gym.ReadState(dirs[id], gym.KindResources, instance, func(r gym.Record) error { return r.Decode(&rec) }); err != nil {
			t.Fatal(err)
		}
		snaps[id] = rec.State.Snapshot
	}
	onDisk := func() []string {
		t.Helper()
		paths, err := filepath.Glob(filepath.Join(base, "snapshots", "*"))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for id, snap := range snaps {
			if slices.Contains(paths, filepath.Join(base, "snapshots", snap)) {
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	for i := 1; i <= 5; i++ {
		commit(fmt.Sprintf("c%d", i))
	}
	if got := onDisk(); !slices.Equal(got, []string{"c1", "c2", "c3", "c4", "c5"}) {
		t.Fatalf("snapshots after five commits whose folders are all there: %v", got)
	}
	for _, id := range []string{"c1", "c2"} {
		if err := os.RemoveAll(dirs[id]); err != nil {
			t.Fatal(err)
		}
	}
	// c6: the owner's own write fails, so its checkpoint never publishes.
	bad := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bad, "gym"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "gym", gym.KindResources), []byte("not a folder"), 0o644); err != nil {
		t.Fatal(err)
	}
	ok(t, "prepare c6", s.control("prepare", "c6", 10*time.Second, nil))
	want(t, "commit c6", s.control("commit", "c6", 30*time.Second, map[string]any{"checkpoint_dir": bad}), http.StatusUnprocessableEntity, gym.CodeCheckpointState)
	ok(t, "resume c6", s.control("resume", "c6", 5*time.Second, nil))
	paths, _ := filepath.Glob(filepath.Join(base, "snapshots", "ck-c6-*"))
	if len(paths) != 1 {
		t.Fatalf("the failed commit of c6 took snapshots %v, want one", paths)
	}
	snaps["c6"] = filepath.Base(paths[0])
	commit("c7")
	if got := onDisk(); !slices.Equal(got, []string{"c3", "c4", "c5", "c7"}) {
		t.Fatalf("snapshots after c7: those of %v, want c3, c4, c5 and c7 (the folders of c1 and c2 are gone, c6 never published)", got)
	}
	fresh := newServer(t, base)
	restored := ok(t, "restore c3", fresh.control("restore", "r3", 30*time.Second,
		map[string]any{"checkpoint_dir": dirs["c3"], "episode_ids": episodes("keep")}))
	if fmt.Sprint(restored.body["restored"]) != "[keep-a1]" {
		t.Fatalf("restore of c3: %s", restored.raw)
	}
}

// sessionState is what a refused call must leave as it was: the session
// (open, not verified, on its sandbox) and its sandbox's files.
func (s *server) sessionState(c owner.Cookies) string {
	s.t.Helper()
	info, err := s.own.Session(c)
	if err != nil {
		s.t.Fatalf("session of %v: %v", c, err)
	}
	files := "gone"
	if s.exists(info.SandboxID) {
		files = s.hostFile(info.SandboxID, "a.txt")
	}
	return fmt.Sprintf("closed=%v verified=%v sandbox=%s a.txt=%q", info.Closed, info.Verified, info.SandboxID, files)
}

// TestSessionCallsNeedTheirSessionsCookie (issue 18, finding 1): a call on
// a session (sandbox_access, verify, close_session, with and without the
// /ng-rollout/<key>/ prefix) without that session's cookie, with a wrong
// secret, with the session id alone (the cookie of old) or with another
// live session's cookie is refused 401 unauthorized in Gym's envelope,
// tells nothing of the session and changes neither session; a seed of the
// key without the cookie is refused the same way and sets no cookie. The
// sessions' own calls work after.
func TestSessionCallsNeedTheirSessionsCookie(t *testing.T) {
	s := newServer(t, t.TempDir())
	a := s.mustSeed("a", map[string]any{"files": map[string]string{"a.txt": "A"}, "check": "test \"$(cat a.txt)\" = A"})
	b := s.mustSeed("b", map[string]any{"files": map[string]string{"a.txt": "B"}})
	aID := lending.SessionIDOf(a.cookies)
	beforeA, beforeB := s.sessionState(a.cookies), s.sessionState(b.cookies)
	_, aSecret, _ := strings.Cut(a.cookies[lending.CookieName], ".")
	forged := owner.Cookies{lending.CookieName: aID + "." + strings.Repeat("0", 64)}
	cases := map[string]owner.Cookies{
		"no cookie":               nil,
		"an empty cookie":         {lending.CookieName: ""},
		"a wrong secret":          forged,
		"the session id alone":    {lending.CookieName: aID},
		"another session's":       b.cookies,
		"another cookie name":     {"other": a.cookies[lending.CookieName]},
		"a's secret under b's id": {lending.CookieName: lending.SessionIDOf(b.cookies) + "." + aSecret},
	}
	for _, call := range []string{"sandbox_access", "verify", "close_session"} {
		for _, path := range []string{"/ng-rollout/a/" + call, "/" + call} {
			for name, c := range cases {
				if path == "/"+call && name == "another session's" {
					continue // without a key the cookie names its own session: b's, legitimately
				}
				r := s.post(path, c, map[string]any{"response": map[string]any{}})
				want(t, path+" with "+name, r, http.StatusUnauthorized, gym.CodeUnauthorized)
				if strings.Contains(r.raw, handle(t, a)) || strings.Contains(r.raw, aID) || len(r.cookies) > 0 {
					t.Errorf("%s with %s told %s (cookies %v)", path, name, r.raw, r.cookies)
				}
			}
		}
	}
	for name, c := range cases {
		r := s.seedWith("a", c, map[string]any{})
		want(t, "a seed of a with "+name, r, http.StatusUnauthorized, gym.CodeUnauthorized)
		if len(r.cookies) > 0 || strings.Contains(r.raw, handle(t, a)) {
			t.Errorf("a seed of a with %s was told %v %s", name, r.cookies, r.raw)
		}
	}
	if after := s.sessionState(a.cookies); after != beforeA {
		t.Errorf("session a after the refused calls: %s, before %s", after, beforeA)
	}
	if after := s.sessionState(b.cookies); after != beforeB {
		t.Errorf("session b after the refused calls: %s, before %s", after, beforeB)
	}
	acc := ok(t, "a's own sandbox_access", s.post("/ng-rollout/a/sandbox_access", a.cookies, map[string]any{}))
	if acc.body["connection"].(map[string]any)["descriptor"].(map[string]any)["sandbox_id"] != handle(t, a) {
		t.Fatalf("a's sandbox_access %s", acc.raw)
	}
	if v := ok(t, "a's own verify", s.post("/ng-rollout/a/verify", a.cookies, map[string]any{"response": map[string]any{}})); v.body["reward"] != float64(1) {
		t.Fatalf("a's verify %s", v.raw)
	}
	ok(t, "b's own close", s.post("/ng-rollout/b/close_session", b.cookies, map[string]any{}))
}

// TestARestoredSessionSoughtWithoutItsCookieIsReplacedNotHandedOut (issue
// 18, finding 1): after a restore, a seed of the next attempt without the
// restored session's cookie (a driver whose checkpoint caught it before
// its seed reply never had it) gets a fresh session: a new cookie and a
// fresh sandbox from its own body, never the restored session's cookie or
// sandbox. The restored session is gone with its fork, and its cookie no
// longer acts.
func TestARestoredSessionSoughtWithoutItsCookieIsReplacedNotHandedOut(t *testing.T) {
	base, dir := t.TempDir(), t.TempDir()
	s := newServer(t, base)
	seeded := s.mustSeed("r", map[string]any{"files": map[string]string{"a.txt": "one"}})
	s.writeFile(handle(t, seeded), "a.txt", "two")
	s.commit("c1", dir, nil)
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))

	fresh := newServer(t, base)
	ok(t, "restore", fresh.control("restore", "r1", 30*time.Second, map[string]any{"checkpoint_dir": dir, "episode_ids": episodes("r")}))
	ok(t, "resume", fresh.control("resume", "r1", 5*time.Second, nil))
	restoredID := lending.SessionIDOf(seeded.cookies)
	fork := ""
	for _, sb := range sandboxes(t, base) {
		if strings.HasPrefix(sb, "sb-"+restoredID+"-") && sb != handle(t, seeded) {
			fork = sb
		}
	}
	if fork == "" {
		t.Fatalf("no fork of %s among %v", restoredID, sandboxes(t, base))
	}
	again := fresh.mustSeed("r-a1", map[string]any{"files": map[string]string{"a.txt": "one"}})
	if lending.SessionIDOf(again.cookies) == restoredID || again.cookies[lending.CookieName] == seeded.cookies[lending.CookieName] ||
		handle(t, again) == fork || strings.Contains(again.raw, restoredID) {
		t.Fatalf("a seed without the cookie was answered with the restored session: %v %s", again.cookies, again.raw)
	}
	if got := fresh.hostFile(handle(t, again), "a.txt"); got != "one" {
		t.Fatalf("the fresh session's a.txt is %q, want its own seed's \"one\"", got)
	}
	if fresh.exists(fork) {
		t.Errorf("the replaced restored session's fork %s is still there", fork)
	}
	want(t, "the restored cookie after the replacement", fresh.post("/ng-rollout/r-a1/sandbox_access", seeded.cookies, map[string]any{}), http.StatusUnauthorized, gym.CodeUnauthorized)
	if got := fresh.counts()["sessions"]; got != float64(1) {
		t.Fatalf("sessions after the replacement: %v", got)
	}
	ok(t, "the fresh session's verify", fresh.post("/ng-rollout/r-a1/verify", again.cookies, map[string]any{}))
}

// TestABadBodyIsTheCallersFault: a seed whose run body the owner cannot
// read (not a JSON object, a field of the wrong type, a file outside the
// workdir) is refused 400 bad_request naming what is wrong, as `ngdriver
// owner serve` wires the owner (lending.ClientError), and makes no
// sandbox; a verify body that is not an object is refused 400 too (it was
// 500 before ErrBadVerifyBody).
func TestABadBodyIsTheCallersFault(t *testing.T) {
	base := t.TempDir()
	s := newServer(t, base)
	for body, names := range map[string]string{
		`[1]`:                          "not a JSON object",
		`{"files": 3}`:                 "files",
		`{"files": {"../escape": ""}}`: "../escape",
		`{"verify_mode": "fast"}`:      "verify_mode",
	} {
		r := s.post(httpowner.RolloutPath("bad", "seed_session"), nil, body)
		want(t, "seed of "+body, r, http.StatusBadRequest, httpowner.CodeBadRequest)
		if !strings.Contains(r.raw, names) {
			t.Errorf("seed of %s: %s does not name %s", body, r.raw, names)
		}
	}
	if got := sandboxes(t, base); len(got) != 0 {
		t.Errorf("bad seeds made sandboxes %v", got)
	}
	// So is a verify body that is not a JSON object (docs/gym.md: 400 for a
	// malformed run or verify body); the session stays open.
	seeded := s.mustSeed("good", map[string]any{})
	want(t, "verify of [1]", s.post("/ng-rollout/good/verify", seeded.cookies, `[1]`), http.StatusBadRequest, httpowner.CodeBadRequest)
	if info, err := s.own.Session(seeded.cookies); err != nil || info.Closed {
		t.Errorf("a refused verify ended the session: %+v %v", info, err)
	}
}

// TestOwnerErrorRepliesAreCapped (issue 18, finding 2): whatever a caller
// sends, no error reply of the owner is longer than the documented cap: a
// 60 KB cookie, a malformed 60 KB capture key, a control call without the token
// whose body holds a 4 MiB checkpoint id of NUL bytes (refused 401 before
// the body is read) and the same call with the token (422, its detail
// capped).
func TestOwnerErrorRepliesAreCapped(t *testing.T) {
	s := newServer(t, t.TempDir())
	s.mustSeed("r", map[string]any{})
	huge := strings.Repeat("c", 60<<10)
	capped := func(what string, r reply, status int) {
		t.Helper()
		if r.status != status {
			t.Errorf("%s: %d %.300s, want %d", what, r.status, r.raw, status)
		}
		e, _ := r.body["error"].(map[string]any)
		detail, _ := e["detail"].(string)
		if detail == "" {
			if d, _ := r.body["detail"].([]any); len(d) == 1 {
				detail, _ = d[0].(map[string]any)["msg"].(string)
			}
		}
		if detail == "" || len(detail) > gym.MaxDetailBytes || len(r.raw) > 6*gym.MaxDetailBytes {
			t.Errorf("%s: a reply of %d bytes, detail %d bytes (cap %d): %.300s", what, len(r.raw), len(detail), gym.MaxDetailBytes, r.raw)
		}
	}
	capped("sandbox_access with a 60 KB cookie", s.post("/sandbox_access", owner.Cookies{lending.CookieName: huge}, map[string]any{}), http.StatusUnauthorized)
	capped("verify of key r with a 60 KB cookie", s.post("/ng-rollout/r/verify", owner.Cookies{lending.CookieName: huge}, map[string]any{}), http.StatusUnauthorized)
	capped("a seed under a malformed 60 KB key", s.seed("-"+huge, map[string]any{}), http.StatusUnprocessableEntity)
	body, err := json.Marshal(map[string]any{"checkpoint_id": strings.Repeat("\x00", 4<<20), "deadline_ts": 1})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, s.url+gym.RoutePrefix+"/prepare", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r := reply{status: resp.StatusCode, raw: string(raw)}
	_ = json.Unmarshal(raw, &r.body)
	want(t, "prepare without a token and a 4 MiB id", r, http.StatusUnauthorized, gym.CodeUnauthorized)
	capped("prepare without a token and a 4 MiB id", r, http.StatusUnauthorized)
	capped("prepare with the token and a 4 MiB id", s.post(gym.RoutePrefix+"/prepare", nil, string(body)), http.StatusUnprocessableEntity)
	if st := s.status(); st.body["phase"] != "idle" {
		t.Fatalf("status after the refused prepares: %s", st.raw)
	}
}

// fullDisk mounts a tmpfs of size bytes on a folder of the test and
// returns it; it is unmounted when the test ends. It needs root.
func fullDisk(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a full disk is a tmpfs mount: this test needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Fatalf("mount a tmpfs of %d bytes on %s: %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// TestAnOwnerSnapshotOnAFullDiskIsRefusedAsTheAgentsWriteIs (issue 18,
// finding 8): a commit whose snapshot of a sandbox meets a full disk
// answers what the agent's commit answers when its records meet one, by
// the one rule (gym.StorageRefusal): 422 invalid_checkpoint_state, the
// detail naming the path and the cause, not 500 internal_error. The
// owner takes the next checkpoint once there is room again.
func TestAnOwnerSnapshotOnAFullDiskIsRefusedAsTheAgentsWriteIs(t *testing.T) {
	base := fullDisk(t, 1<<20)
	s := newServer(t, base)
	seeded := s.mustSeed("r", map[string]any{"files": map[string]string{"a.txt": "one"}})
	s.writeFile(handle(t, seeded), "big", strings.Repeat("x", 700<<10))
	dir := t.TempDir()
	ok(t, "prepare", s.control("prepare", "c1", 30*time.Second, nil))
	refused := s.control("commit", "c1", 30*time.Second, map[string]any{"checkpoint_dir": dir})
	want(t, "a commit whose snapshot fills the disk", refused, http.StatusUnprocessableEntity, gym.CodeCheckpointState)
	detail := refused.body["error"].(map[string]any)["detail"].(string)
	if !strings.Contains(detail, filepath.Join(base, "snapshots")) || !strings.Contains(strings.ToLower(detail), "no space left on device") {
		t.Errorf("the refusal does not name the path and the cause: %s", detail)
	}

	// The agent's side of the same rule: records written to a full disk.
	filler, err := os.Create(filepath.Join(base, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = filler.Write(make([]byte, 64<<10))
	}
	filler.Close()
	rec, err := gym.NewRecord(map[string]any{"episode_id": map[string]any{"rollout_id": "r"}, "x": strings.Repeat("y", 64<<10)})
	if err != nil {
		t.Fatal(err)
	}
	_, werr := gym.WriteState(filepath.Join(base, "agent-ck"), gym.KindAgent, "drv", "c1", []gym.Record{rec}, nil, nil)
	if status, code := gym.Classify(werr); status != refused.status || code != refused.code() {
		t.Errorf("the agent's write on a full disk is %d %s (%v), the owner's snapshot %d %s", status, code, werr, refused.status, refused.code())
	}

	if err := os.Remove(filepath.Join(base, "filler")); err != nil {
		t.Fatal(err)
	}
	s.writeFile(handle(t, seeded), "big", "small now")
	ok(t, "resume", s.control("resume", "c1", 5*time.Second, nil))
	committed := s.commit("c2", dir, nil)
	if fmt.Sprint(committed.body["episode_ids"]) != "[r]" {
		t.Fatalf("the commit after room was made: %s", committed.raw)
	}
}
