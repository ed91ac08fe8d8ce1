package gym

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func serve(t *testing.T) (*fake, *httptest.Server) {
	t.Helper()
	f, c := newFake(t, time.Minute)
	h, err := NewHandler(c, "secret")
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return f, s
}

func call(t *testing.T, s *httptest.Server, method, op, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+RoutePrefix+"/"+op, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s %s answered %d with non-JSON %q", method, op, resp.StatusCode, data)
	}
	return resp.StatusCode, v
}

func code(v map[string]any) any {
	e, _ := v["error"].(map[string]any)
	return e["code"]
}

// The routes over real HTTP on loopback, as a coordinator calls them:
// discovery, auth, validation, a checkpoint and the error envelope.
func TestHandlerRoutes(t *testing.T) {
	f, s := serve(t)
	deadline := func(secs float64) string { return jsonFloat(nowSeconds() + secs) }
	body := func(id string, extra string) string {
		return `{"checkpoint_id":"` + id + `","deadline_ts":` + deadline(5) + extra + `}`
	}

	if st, v := call(t, s, "GET", "status", "secret", ""); st != 200 || v["kind"] != "agent" || v["phase"] != "idle" || v["accepting"] != true {
		t.Fatalf("status = %d %v", st, v)
	}
	if st, v := call(t, s, "GET", "status", "wrong", ""); st != 401 || code(v) != "unauthorized" {
		t.Fatalf("wrong token = %d %v", st, v)
	}
	if st, v := call(t, s, "GET", "status", "", ""); st != 401 || code(v) != "unauthorized" {
		t.Fatalf("no token = %d %v", st, v)
	}
	if st, _ := call(t, s, "GET", "nothing", "secret", ""); st != 404 {
		t.Fatalf("unknown route = %d", st)
	}
	if st, _ := call(t, s, "GET", "prepare", "secret", ""); st != 405 {
		t.Fatalf("GET prepare = %d", st)
	}
	// The token is checked before the body is read: a bad body without
	// it is 401, with it 422.
	if st, v := call(t, s, "POST", "prepare", "", `{"checkpoint_id":"c1"}`); st != 401 || code(v) != "unauthorized" {
		t.Fatalf("bad body without a token = %d %v", st, v)
	}
	if st, v := call(t, s, "POST", "prepare", "secret", `{"checkpoint_id":"c1"}`); st != 422 || v["detail"] == nil {
		t.Fatalf("bad body = %d %v", st, v)
	}
	if st, v := call(t, s, "POST", "prepare", "", body("c1", "")); st != 401 || code(v) != "unauthorized" {
		t.Fatalf("prepare without a token = %d %v", st, v)
	}

	st, v := call(t, s, "POST", "prepare", "secret", body("c1", ""))
	report, _ := v["report"].(map[string]any)
	if st != 200 || v["phase"] != "prepared" || report["ready"] != true || f.isOpen() {
		t.Fatalf("prepare = %d %v", st, v)
	}
	if st, v := call(t, s, "POST", "prepare", "secret", body("c2", "")); st != 409 || code(v) != "checkpoint_conflict" {
		t.Fatalf("second checkpoint = %d %v", st, v)
	}
	if st, v := call(t, s, "POST", "renew", "secret", body("c1", "")); st != 200 || v["lease_expires_at"] == nil {
		t.Fatalf("renew = %d %v", st, v)
	}
	dir := t.TempDir()
	st, v = call(t, s, "POST", "commit", "secret", body("c1", `,"checkpoint_dir":"`+dir+`","episode_ids":[]`))
	manifest, _ := v["manifest"].(map[string]any)
	if st != 200 || v["phase"] != "committed" || manifest["schema_version"] != 1.0 || manifest["kind"] != "agent" {
		t.Fatalf("commit = %d %v", st, v)
	}
	if st, v := call(t, s, "POST", "resume", "secret", body("c1", "")); st != 200 || v["phase"] != "idle" || v["idempotent"] != false || !f.isOpen() {
		t.Fatalf("resume = %d %v", st, v)
	}
	if st, v := call(t, s, "POST", "prepare", "secret", body("c1", "")); st != 409 || code(v) != "stale_checkpoint" {
		t.Fatalf("stale prepare = %d %v", st, v)
	}
	if st, v := call(t, s, "POST", "retire", "secret", body("retire", `,"episode_ids":[{"rollout_id":"r","attempt":1}]`)); st != 200 || v["retired"].([]any)[0] != "r-a1" {
		t.Fatalf("retire = %d %v", st, v)
	}
	if st, v := call(t, s, "POST", "forget", "secret", body("forget", `,"rollout_ids":["r"]`)); st != 200 || v["forgotten"].([]any)[0] != "r" {
		t.Fatalf("forget = %d %v", st, v)
	}
	if st, v := call(t, s, "POST", "restore", "secret", body("r1", `,"checkpoint_dir":"`+t.TempDir()+`","episode_ids":[]`)); st != 422 || code(v) != "invalid_checkpoint_state" {
		t.Fatalf("restore from an empty folder = %d %v", st, v)
	}
	if _, err := NewHandler(nil, ""); err == nil {
		t.Fatal("an empty token was taken")
	}
}

// jsonFloat formats epoch seconds for a body.
func jsonFloat(f float64) string { return strings.TrimSpace(string(must(json.Marshal(f)))) }
