package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/e2eproc"
)

// freePort is a loopback port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// gymConfigDict is a Gym config as Gym's launcher passes it in
// NEMO_GYM_CONFIG_DICT: every server keyed by name with host and port,
// the global checkpoint block, and the reserved keys it adds.
func (e *env) gymConfigDict(agentPort int, ownerURL string) string {
	u, err := url.Parse(ownerURL)
	if err != nil {
		e.t.Fatal(err)
	}
	return fmt.Sprintf(`gym_owner:
  resources_servers:
    ngdriver_owner:
      entrypoint: app.py
      domain: coding
      host: %s
      port: %s
policy_model:
  responses_api_models:
    vllm_model:
      entrypoint: app.py
      host: 127.0.0.1
      port: 1
gym_e2e_agent:
  responses_api_agents:
    ngdriver_agent:
      entrypoint: app.py
      num_workers: 4
      host: 127.0.0.1
      port: %d
      resources_server: {type: resources_servers, name: gym_owner}
      model_server: {type: responses_api_models, name: policy_model}
      datasets: []
      ngdriver:
        adapter: fake
        max_runs: 8
        stop_grace: 1s
        shutdown_timeout: 30s
        ngsup_dir: %s
        log_format: json
        backends:
          local:
            base: %s
        fake:
          steps: 3
          step_s: 0.05
checkpoint:
  enabled: true
  control_auth_token: %s
  lease_grace_seconds: 120
head_server: {host: 127.0.0.1, port: 11000}
disallowed_ports: [11000, %d]
dry_run: false
verbose: true
`, u.Hostname(), u.Port(), agentPort, binDir, e.base, e.token, agentPort)
}

// TestGymConfigDict: `ngdriver serve` started as Gym's launcher starts a
// server (NEMO_GYM_CONFIG_DICT and NEMO_GYM_CONFIG_PATH, no flags) listens
// on the entry's host and port, takes the checkpoint block's token on the
// control routes (and refuses calls without it), reaches the owner the
// resources_server reference names, and logs the Gym keys it ignores.
func TestGymConfigDict(t *testing.T) {
	e := newEnv(t, options{})
	port := freePort(t)
	env := []string{
		"NEMO_GYM_CONFIG_DICT=" + e.gymConfigDict(port, e.ownerURL),
		"NEMO_GYM_CONFIG_PATH=gym_e2e_agent",
		"NG_CONTROL_TOKEN=not-the-gym-token",
	}
	p := e2eproc.StartProc(t, ngdriverBin, "gymdriver", e.logs, env, "serve")
	e.mu.Lock()
	e.drivers = append(e.drivers, p)
	e.mu.Unlock()
	got := p.URL(t)
	if want := fmt.Sprintf("http://127.0.0.1:%d", port); got != want {
		t.Fatalf("listening on %s, want %s (the entry's host and port)", got, want)
	}
	e.ctl = &controller{name: "gymdriver", url: got, token: e.token}

	wantRefused(t, e.ctl.raw(t, "prepare", "", plainBody("gym-none")), http.StatusUnauthorized, "unauthorized")
	wantRefused(t, e.ctl.raw(t, "prepare", "Bearer not-the-gym-token", plainBody("gym-env")), http.StatusUnauthorized, "unauthorized")
	e.ctl.must(t, "prepare", plainBody("gym-ck"), nil)
	e.ctl.must(t, "resume", plainBody("gym-ck"), nil)

	rollout := e.rollout("gym")
	res := await(t, e.startRun("/run", rollout, e.body(rollout, 3, 0.05))).result(t)
	if res.Reward != 1 {
		t.Errorf("run through the Gym-configured driver: reward %v (%s: %s)", res.Reward, res.FailureKind, res.FailureReason)
	}

	logs := p.Errs.String()
	for _, w := range []string{"configured from the Gym config", `"instance":"gym_e2e_agent"`, `"owner":"` + e.ownerURL,
		`"lease_grace":"2m0s"`, "gym_e2e_agent.responses_api_agents.ngdriver_agent.num_workers"} {
		if !strings.Contains(logs, w) {
			t.Errorf("the driver's log does not say %q:\n%s", w, e2eproc.Tail(logs, 3000))
		}
	}
}

// TestGymConfigErrors: a Gym config that names no entry for this server, or
// a resources server that is not in it, makes `ngdriver serve` exit 2 with
// one line naming what is missing; --config still wins over the variable.
func TestGymConfigErrors(t *testing.T) {
	dir := t.TempDir()
	e := &env{t: t, base: dir, token: "tok"}
	dict := e.gymConfigDict(freePort(t), "http://127.0.0.1:1")
	cases := []struct {
		name  string
		env   []string
		args  []string
		words []string
	}{
		{"no entry", []string{"NEMO_GYM_CONFIG_DICT=" + dict, "NEMO_GYM_CONFIG_PATH=other_agent"}, nil,
			[]string{"NEMO_GYM_CONFIG_DICT", "other_agent"}},
		{"missing resources server", []string{"NEMO_GYM_CONFIG_DICT=" + strings.Replace(dict, "name: gym_owner", "name: gym_ownr", 1),
			"NEMO_GYM_CONFIG_PATH=gym_e2e_agent"}, nil, []string{"resources_server", "gym_ownr"}},
		{"--config wins", []string{"NEMO_GYM_CONFIG_DICT=" + dict}, []string{"--config", dir + "/none.yaml"},
			[]string{dir + "/none.yaml"}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			code, out, errs := runCLI(t, c.env, append([]string{"serve"}, c.args...)...)
			if code != 2 || strings.Contains(out, "listening") {
				t.Errorf("exit %d, stdout %q; want 2 before listening", code, out)
			}
			for _, w := range c.words {
				if !strings.Contains(errs, w) {
					t.Errorf("the error %q does not name %q", strings.TrimSpace(errs), w)
				}
			}
			if n := strings.Count(strings.TrimSpace(errs), "\n"); n > 0 {
				t.Errorf("the error takes %d lines, want one: %q", n+1, errs)
			}
		})
	}
}
