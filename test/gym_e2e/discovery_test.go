package gyme2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/config/gymconfig"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestDiscovery: Gym's coordinator (gymDiscover, Gym's discover rules)
// finds the fake model (kind model), the agent (kind agent, its entry name
// as instance) and the owner (kind resources) with GET status, in
// PREPARE_ORDER, and a second agent server of the same config with
// checkpointing off answers 404 there, which Gym's discover takes as "not
// a participant". An idle participant's status is phase idle with null
// checkpoint_id and lease_expires_at, no retired rollouts, and a ready
// report; the agent's also says accepting. Status needs the bearer token.
// A checkpoint of an idle deployment writes empty records on all three.
func TestDiscovery(t *testing.T) {
	w := newWorld(t, options{})
	offPort := freePort(t)
	offCfg := filepath.Join(w.dir, "gym-off.yaml")
	w.writeConfig(offCfg, "ngdriver_agent_off", offPort, false)
	offURL := fmt.Sprintf("http://127.0.0.1:%d", offPort)
	w.start("agentoff", offURL, "serve", "--gym-config", offCfg, "--gym-instance", "ngdriver_agent_off")

	servers := append(w.servers(), gymconfig.Server{Name: "ngdriver_agent_off", URL: offURL})
	r := w.coord.call("ngdriver_agent_off", offURL, gym.OpStatus, nil, w.coord.bearer())
	if r.status != http.StatusNotFound {
		t.Errorf("checkpointing off: %s, want 404 (not a participant)", r)
	}
	members := w.coord.discover(servers)
	var names []string
	for _, m := range members {
		names = append(names, m.Name+":"+m.Kind)
	}
	if want := []string{modelEntry + ":model", agentEntry + ":agent", ownerEntry + ":resources"}; !slices.Equal(names, want) {
		t.Fatalf("discovered %q, want %q in PREPARE_ORDER", names, want)
	}
	for _, m := range members {
		st := w.coord.status(m)
		if st.Phase != gym.PhaseIdle || st.CheckpointID != nil || st.LeaseExpiresAt != nil || st.RetiredRollouts != 0 || !st.Report.Ready {
			t.Errorf("%s idle status: %+v", m.Name, st)
		}
		if m.Kind == gym.KindAgent && (st.Accepting == nil || !*st.Accepting) {
			t.Errorf("%s idle status: accepting %v, want true", m.Name, deref(st.Accepting))
		}
		for _, auth := range []string{"", "Bearer wrong-" + w.token, w.token} {
			checkRefusal(t, w.coord.call(m.Name, m.URL, gym.OpStatus, nil, auth), gym.CodeUnauthorized)
		}
	}
	// With nothing in flight a checkpoint writes empty records: a 0-byte
	// records file named after the digest of nothing, record_count 0.
	id := ckID("empty")
	ck := w.checkpoint(id, nil, false)
	for name, cr := range ck.commits {
		if cr.Manifest["record_count"] != float64(0) || cr.Manifest["records_sha256"] != emptySHA256 || len(cr.EpisodeIDs) != 0 {
			t.Errorf("%s: the empty checkpoint's manifest %v, episode_ids %q", name, cr.Manifest, cr.EpisodeIDs)
		}
	}
	w.coord.resume(id, deadlineIn(waitLimit))
}

// emptySHA256 is the sha256 of no bytes.
const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// TestDiscoveryNeedsAPolicyModelTakingPart: Gym's discover refuses a
// deployment of ngdriver's two servers alone (no policy model takes part),
// and one whose model server does not take part (the fake model without a
// control token answers 404 there), with Gym's own words; the world's
// deployment passes because its fake model takes part (kind model).
func TestDiscoveryNeedsAPolicyModelTakingPart(t *testing.T) {
	w := newWorld(t, options{})
	const want = "checkpoint discover failed on 1 participant(s): deployment: no policy model takes part in checkpoints"
	var alone []gymconfig.Server
	for _, s := range w.servers() {
		if s.Name != modelEntry {
			alone = append(alone, s)
		}
	}
	if _, _, err := w.coord.gymDiscover(alone); err == nil || err.Error() != want {
		t.Errorf("ngdriver's two servers alone: discover %v, want %q", err, want)
	}
	plainPort := freePort(t)
	plainURL := fmt.Sprintf("http://127.0.0.1:%d", plainPort)
	w.startProgram(fakemodelBin, "plainmodel", plainURL, "-listen", fmt.Sprintf("127.0.0.1:%d", plainPort))
	if r := w.coord.call(modelEntry, plainURL, gym.OpStatus, nil, w.coord.bearer()); r.status != http.StatusNotFound {
		t.Errorf("a fake model without a control token: %s, want 404", r)
	}
	if _, _, err := w.coord.gymDiscover(append(alone, gymconfig.Server{Name: modelEntry, URL: plainURL})); err == nil || err.Error() != want {
		t.Errorf("with a model that does not take part: discover %v, want %q", err, want)
	}
	if members, _, err := w.coord.gymDiscover(w.servers()); err != nil || members[0].Kind != gym.KindModel {
		t.Errorf("the deployment with the fake model taking part: %+v, %v", members, err)
	}
}

// kindOnly is a participant of any kind that holds nothing: Gym's Recorder
// (test_checkpoint_coordination.py) as far as discover reads it.
type kindOnly struct{ kind atomic.Value }

func newKindOnly(kind string) *kindOnly {
	p := &kindOnly{}
	p.kind.Store(kind)
	return p
}

func (p *kindOnly) Kind() string                                                  { return p.kind.Load().(string) }
func (p *kindOnly) CloseAdmission(context.Context, gym.Request) error             { return nil }
func (p *kindOnly) OpenAdmission(context.Context) error                           { return nil }
func (p *kindOnly) Readiness() gym.Report                                         { return gym.NewReport(true, nil, nil, nil) }
func (p *kindOnly) Export(context.Context, []gym.EpisodeID) ([]gym.Record, error) { return nil, nil }
func (p *kindOnly) Install(context.Context, []gym.Record, []gym.EpisodeID) error  { return nil }
func (p *kindOnly) Retire(context.Context, gym.EpisodeID) error                   { return nil }
func (p *kindOnly) ParkExported(context.Context, []gym.Record) error              { return nil }

// serverTypes is Gym's test's SERVER_TYPES: the config key of each kind (a
// server without a participant is a model server, as there).
var serverTypes = map[string]string{
	"environment": "environment_servers", "model": "responses_api_models",
	"agent": "responses_api_agents", "resources": "resources_servers", "": "responses_api_models",
}

// fakeDeployment is Gym's test's deployment(): one server per (name, kind)
// on loopback, a participant of that kind with pkg/gym's control plane and
// routes, or, for kind "", a server without control routes (404); the
// config lists each under its server type; servers are what Gym's
// discover walks in it (gymconfig.Servers).
func fakeDeployment(t *testing.T, token string, entries ...[2]string) ([]gymconfig.Server, map[string]*kindOnly) {
	t.Helper()
	parts := map[string]*kindOnly{}
	var cfg strings.Builder
	cfg.WriteString("checkpoint: {enabled: true, control_auth_token: " + token + "}\n")
	for _, e := range entries {
		name, kind := e[0], e[1]
		var h http.Handler = http.NotFoundHandler()
		if kind != "" {
			parts[name] = newKindOnly(kind)
			ctl, err := gym.NewControl(parts[name], gym.Config{Instance: name, LeaseGrace: time.Minute, Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			if h, err = gym.NewHandler(ctl, token); err != nil {
				t.Fatal(err)
			}
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
		fmt.Fprintf(&cfg, "%s: {%s: {%s: {host: %s, port: %s}}}\n", name, serverTypes[kind], name, host, port)
	}
	servers, err := gymconfig.Servers([]byte(cfg.String()))
	if err != nil {
		t.Fatal(err)
	}
	return servers, parts
}

// full is Gym's test's FULL deployment.
var full = [][2]string{{"res", "resources"}, {"agent", "agent"}, {"policy", "model"}, {"env", "environment"}, {"judge", ""}}

// countingTransport counts the requests it carries.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// TestGymDiscoverRules ports the discover cases of Gym's
// tests/unit_tests/test_checkpoint_coordination.py (NVIDIA-NeMo/Gym at
// 9288a797d3580cb2d1beb34d7b6f41ed0ff51b0a, the version that tests
// coordination.py 011c338's discover) to gymDiscover, each subtest named
// after the Gym test it ports, over real HTTP on loopback.
func TestGymDiscoverRules(t *testing.T) {
	const token = "t"
	t.Run("orders_participants_and_skips_servers_without_control_routes", func(t *testing.T) {
		servers, _ := fakeDeployment(t, token, full...)
		members, _, err := newCoordinator(t, token).gymDiscover(servers)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range members {
			got = append(got, m.Name+":"+m.Kind)
		}
		if want := []string{"env:environment", "policy:model", "agent:agent", "res:resources"}; !slices.Equal(got, want) {
			t.Errorf("members %q, want %q", got, want)
		}
	})
	t.Run("refuses_a_deployment_without_a_policy_model", func(t *testing.T) {
		servers, _ := fakeDeployment(t, token, [2]string{"env", "environment"}, [2]string{"judge", ""})
		if _, _, err := newCoordinator(t, token).gymDiscover(servers); err == nil || !strings.Contains(err.Error(), "no policy model") {
			t.Errorf("discover: %v, want no policy model", err)
		}
	})
	t.Run("reports_a_server_that_is_down_instead_of_retrying_forever", func(t *testing.T) {
		down := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		c := newCoordinator(t, token)
		tr := &countingTransport{}
		c.client = &http.Client{Transport: tr}
		_, _, err := c.gymDiscover([]gymconfig.Server{{Name: "env", URL: down}})
		if err == nil || !strings.Contains(err.Error(), "env") {
			t.Errorf("discover: %v, want a failure naming env", err)
		}
		if n := tr.n.Load(); n != discoverTries {
			t.Errorf("%d tries, want %d", n, discoverTries)
		}
	})
	t.Run("reports_a_server_that_never_replies", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held := make(chan net.Conn, 16)
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				held <- conn // accepted, never answered
			}
		}()
		t.Cleanup(func() {
			ln.Close()
			for len(held) > 0 {
				(<-held).Close()
			}
		})
		c := newCoordinator(t, token)
		c.discoverTimeout = 50 * time.Millisecond
		_, _, err = c.gymDiscover([]gymconfig.Server{{Name: "env", URL: "http://" + ln.Addr().String()}})
		if err == nil || !strings.Contains(err.Error(), "env: no status reply within 0.05 seconds") {
			t.Errorf("discover: %v, want env: no status reply within 0.05 seconds", err)
		}
	})
	t.Run("reports_a_participant_of_an_unknown_kind", func(t *testing.T) {
		servers, parts := fakeDeployment(t, token, full...)
		parts["agent"].kind.Store("planner")
		if _, _, err := newCoordinator(t, token).gymDiscover(servers); err == nil || !strings.Contains(err.Error(), "agent: unknown participant kind 'planner'") {
			t.Errorf("discover: %v, want agent: unknown participant kind 'planner'", err)
		}
	})
	// Beyond Gym's cases, its rules: a participant that refuses the token
	// fails discovery (only 404 means not a participant), every failed
	// server is named, and an entry with no address fails too.
	t.Run("any_other_reply_fails_and_every_failure_is_named", func(t *testing.T) {
		servers, _ := fakeDeployment(t, token, full...)
		servers = append(servers, gymconfig.Server{Name: "noaddr", Err: os.ErrNotExist})
		_, _, err := newCoordinator(t, "wrong").gymDiscover(servers)
		if err == nil || !strings.HasPrefix(err.Error(), "checkpoint discover failed on 5 participant(s): agent: HTTP 401 unauthorized") ||
			!strings.Contains(err.Error(), "noaddr: ") || strings.Contains(err.Error(), "judge") {
			t.Errorf("discover with the wrong token: %v", err)
		}
	})
}
