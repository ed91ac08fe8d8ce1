package opencode

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/pkg/harness"
)

// baseURL is the model URL the adapter gives OpenCode's provider for a
// rollout attempt (OPENCODE_CONFIG_CONTENT).
func baseURL(t *testing.T, a *Adapter, rollout string, attempt int) string {
	t.Helper()
	env, err := a.env(State{Home: "/state"}, rollout, attempt)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Provider map[string]struct {
			Options struct {
				BaseURL string `json:"baseURL"`
			} `json:"options"`
		} `json:"provider"`
	}
	if err := json.Unmarshal([]byte(env["OPENCODE_CONFIG_CONTENT"]), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Provider["ng"].Options.BaseURL
}

// TestRolloutURLEscaped: the rollout segment of the model URL is one
// escaped path segment, whatever the rollout id holds: '?' starts no
// query, '#' no fragment, '/' adds no segment, '%' escapes nothing, and
// the model server (the fake one, over loopback) reads back the exact id
// and attempt. Before the fix the id went in raw: "q?x=1" made the rest of
// the URL a query, "f#g" a fragment.
func TestRolloutURLEscaped(t *testing.T) {
	model := fakemodel.New(fakemodel.Options{})
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	a, err := New(Options{OpenCode: "opencode", CLIOptions: harness.CLIOptions{ModelURL: model.URL() + "/"}})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"plain-1", "q?x=1", "f#g", "a/b", "pct%41", "sp ace", "semi;colon", "..", "uni\u00e9"}
	for _, id := range ids {
		base := baseURL(t, a, id, 2)
		u, err := url.Parse(base)
		if err != nil {
			t.Errorf("id %q: the base URL %q does not parse: %v", id, base, err)
			continue
		}
		segs := strings.Split(u.EscapedPath(), "/")
		if u.RawQuery != "" || u.Fragment != "" || len(segs) != 4 || segs[1] != "ng-rollout" || segs[3] != "v1" {
			t.Errorf("id %q: base URL %q has path segments %q, query %q, fragment %q; want /ng-rollout/<one segment>/v1 and nothing else",
				id, base, segs, u.RawQuery, u.Fragment)
			continue
		}
		if got, err := url.PathUnescape(segs[2]); err != nil || got != id+"-a2" {
			t.Errorf("id %q: the rollout segment %q unescapes to %q (%v), want %q", id, segs[2], got, err, id+"-a2")
		}
		resp, err := http.Post(base+"/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatalf("id %q: %v", id, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("id %q: the model server answered %s to %s", id, resp.Status, base)
		}
	}
	reqs := model.Requests()
	if len(reqs) != len(ids) {
		t.Fatalf("the model server saw %d requests, want %d", len(reqs), len(ids))
	}
	for i, r := range reqs {
		if r.Rollout != ids[i]+"-a2" || r.Attempt != 2 {
			t.Errorf("request %d: the model server read rollout %q attempt %d, want %q attempt 2", i+1, r.Rollout, r.Attempt, ids[i]+"-a2")
		}
	}
}
