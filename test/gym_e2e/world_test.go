package gyme2e

// One test's Gym deployment: a Gym config file naming an agent entry
// (`ngdriver serve --gym-config FILE --gym-instance NAME`), a resources
// entry (`ngdriver owner serve`) and the policy model entry (the fake
// model, taking part in checkpoints as Gym's coordinator requires) on
// fixed loopback ports, so fresh processes after a crash come back at the
// addresses the config names; the coordinator and the collector; and the
// cleanup that leaves nothing running.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"

	"github.com/ngharness/ngharness/pkg/driver/config/gymconfig"
	"github.com/ngharness/ngharness/pkg/gym"
)

// waitLimit bounds every wait on a state: generous, never a statement
// about speed.
const waitLimit = 2 * time.Minute

// The entry names of the deployment's servers in the Gym config: each is
// its participant instance.
const (
	agentEntry = "ngdriver_agent"
	ownerEntry = "ngdriver_resources"
	modelEntry = "policy_model"
)

// options shape a deployment.
type options struct {
	maxRuns    int     // the agent's max_runs (default 16)
	steps      int     // the fake harness's default steps (default 10)
	stepS      float64 // and seconds per step (default 0.3)
	leaseGrace int     // lease_grace_seconds (default 120)
}

// world is one test's deployment.
type world struct {
	t     *testing.T
	dir   string // the test's folder
	base  string // the owner's sandboxes (and the agent's local backend)
	logs  string
	token string
	opts  options

	agentPort, ownerPort, modelPort int
	cfgPath                         string

	mu      sync.Mutex
	procs   []*e2eproc.Proc
	agent   *e2eproc.Proc
	owner   *e2eproc.Proc
	model   *e2eproc.Proc
	orphans e2eproc.Orphans
	since   uint64 // start time of the test's first process

	coord *coordinator
	coll  *collector
}

// newWorld starts the model, the owner and the agent, and discovers them.
func newWorld(t *testing.T, o options) *world {
	t.Helper()
	if o.maxRuns == 0 {
		o.maxRuns = 16
	}
	if o.steps == 0 {
		o.steps = 10
	}
	if o.stepS == 0 {
		o.stepS = 0.3
	}
	if o.leaseGrace == 0 {
		o.leaseGrace = 120
	}
	dir := t.TempDir()
	var tok [16]byte
	rand.Read(tok[:])
	w := &world{
		t: t, dir: dir, base: filepath.Join(dir, "base"), logs: filepath.Join(dir, "logs"),
		token: hex.EncodeToString(tok[:]), opts: o,
		agentPort: freePort(t), ownerPort: freePort(t), modelPort: freePort(t),
	}
	for _, d := range []string{w.base, w.logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(w.cleanup)
	w.cfgPath = filepath.Join(dir, "gym.yaml")
	w.writeConfig(w.cfgPath, agentEntry, w.agentPort, true)
	w.coord = newCoordinator(t, w.token)
	w.coll = &collector{url: w.agentURL(), agentName: agentEntry}
	w.startServers()
	return w
}

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

func (w *world) agentURL() string { return fmt.Sprintf("http://127.0.0.1:%d", w.agentPort) }
func (w *world) ownerURL() string { return fmt.Sprintf("http://127.0.0.1:%d", w.ownerPort) }
func (w *world) modelURL() string { return fmt.Sprintf("http://127.0.0.1:%d", w.modelPort) }

// servers is every server entry of the deployment's config with its URL,
// as Gym's discover walks the global config (gymconfig.Servers).
func (w *world) servers() []gymconfig.Server {
	w.t.Helper()
	data, err := os.ReadFile(w.cfgPath)
	if err != nil {
		w.t.Fatal(err)
	}
	servers, err := gymconfig.Servers(data)
	if err != nil {
		w.t.Fatal(err)
	}
	return servers
}

// writeConfig writes a Gym config as Gym's launcher resolves it: the
// resources entry, the policy model entry, an agent entry named agent on
// port (its ngdriver block runs the fake harness on the local backend,
// which calls no model), and the global checkpoint block (enabled or not).
func (w *world) writeConfig(path, agent string, port int, enabled bool) {
	w.t.Helper()
	cfg := fmt.Sprintf(`# written by the gym_e2e test %s
%s:
  resources_servers:
    ngdriver_owner:
      entrypoint: app.py
      domain: coding
      host: 127.0.0.1
      port: %d
%s:
  responses_api_models:
    fakemodel:
      entrypoint: app.py
      host: 127.0.0.1
      port: %d
%s:
  responses_api_agents:
    ngdriver_agent:
      entrypoint: app.py
      num_workers: 1
      host: 127.0.0.1
      port: %d
      resources_server: {type: resources_servers, name: %s}
      model_server: {type: responses_api_models, name: %s}
      datasets: []
      ngdriver:
        adapter: fake
        max_runs: %d
        pause_at_checkpoints: true
        stop_grace: 1s
        shutdown_timeout: 30s
        ngsup_dir: %s
        log_format: json
        owner:
          timeout: 60s
          verify_timeout: 2m
          retries: 3
        backends:
          local:
            base: %s
        fake:
          steps: %d
          step_s: %g
checkpoint:
  enabled: %v
  control_auth_token: %s
  lease_grace_seconds: %d
`, w.t.Name(), ownerEntry, w.ownerPort, modelEntry, w.modelPort, agent, port, ownerEntry, modelEntry, w.opts.maxRuns, binDir, w.base,
		w.opts.steps, w.opts.stepS, enabled, w.token, w.opts.leaseGrace)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		w.t.Fatal(err)
	}
}

// startServers starts a fresh model, owner and agent and discovers them
// as Gym's coordinator does: exactly one model participant (the model
// entry), one agent participant (this agent entry) and one resources
// participant (the owner entry), in that order.
func (w *world) startServers() {
	w.t.Helper()
	w.model = w.startProgram(fakemodelBin, "model", w.modelURL(), w.modelArgs()...)
	w.owner = w.start("owner", w.ownerURL(), w.ownerArgs()...)
	w.agent = w.start("agent", w.agentURL(), "serve", "--gym-config", w.cfgPath, "--gym-instance", agentEntry)
	members := w.coord.discover(w.servers())
	if len(members) != 3 || members[0].Kind != gym.KindModel || members[0].Name != modelEntry ||
		members[1].Kind != gym.KindAgent || members[1].Name != agentEntry ||
		members[2].Kind != gym.KindResources || members[2].Name != ownerEntry {
		w.t.Fatalf("discovered %+v, want the model %s, the agent %s, then the resources server %s", members, modelEntry, agentEntry, ownerEntry)
	}
	for _, m := range members {
		if m.Instance != m.Name {
			w.t.Errorf("%s's status names instance %q, want its entry name", m.Name, m.Instance)
		}
	}
}

// ownerArgs starts `ngdriver owner serve` as the deployment's resources
// server: on its entry's port, lending local sandboxes under base, a
// participant named after its entry with the deployment's token and lease
// grace (the owner takes them as flags; it reads no Gym config).
func (w *world) ownerArgs() []string {
	return []string{"owner", "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", w.ownerPort),
		"--base", w.base, "--ngsup-dir", binDir, "--log-format", "json",
		"--instance", ownerEntry, "--lease-grace", fmt.Sprintf("%ds", w.opts.leaseGrace),
		"--checkpoint-token-env", "NG_CONTROL_TOKEN",
		// The tests read the sandboxes after their runs: keep them.
		"--keep-sandboxes"}
}

// modelArgs starts the fake model as the deployment's policy model: on
// its entry's port, a participant of kind model named after its entry with
// the deployment's token and lease grace (flags, as the owner takes them).
func (w *world) modelArgs() []string {
	return []string{"-listen", fmt.Sprintf("127.0.0.1:%d", w.modelPort), "-checkpoint-token-env", "NG_CONTROL_TOKEN",
		"-instance", modelEntry, "-lease-grace", fmt.Sprintf("%ds", w.opts.leaseGrace)}
}

// start starts one ngdriver server and waits until it listens at url.
func (w *world) start(role, url string, args ...string) *e2eproc.Proc {
	w.t.Helper()
	return w.startProgram(ngdriverBin, role, url, args...)
}

// startProgram starts one server of bin and waits until it listens at url.
func (w *world) startProgram(bin, role, url string, args ...string) *e2eproc.Proc {
	w.t.Helper()
	w.mu.Lock()
	name := fmt.Sprintf("%s%d", role, len(w.procs))
	w.mu.Unlock()
	p := e2eproc.StartProc(w.t, bin, name, w.logs, []string{"NG_CONTROL_TOKEN=" + w.token}, args...)
	w.mu.Lock()
	w.procs = append(w.procs, p)
	if w.since == 0 {
		w.since = p.Start
	}
	w.mu.Unlock()
	if got := p.URL(w.t); got != url {
		w.t.Fatalf("%s listens on %s, want %s (its entry's host and port)", name, got, url)
	}
	return p
}

// crash kills every server (agent, owner, model) with SIGKILL, each alone,
// as a host losing the processes would; what they had started is
// remembered and ended at cleanup.
func (w *world) crash() {
	w.t.Helper()
	for _, p := range []*e2eproc.Proc{w.agent, w.owner, w.model} {
		w.orphans.Add(p.PID())
		if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
			w.t.Fatalf("kill %s: %v", p.Name, err)
		}
		if _, ok := p.WaitExit(30 * time.Second); !ok {
			w.t.Fatalf("%s did not die from SIGKILL", p.Name)
		}
	}
}

// cleanup ends everything the test started and checks nothing is left.
func (w *world) cleanup() {
	t := w.t
	w.mu.Lock()
	procs := append([]*e2eproc.Proc{}, w.procs...)
	w.mu.Unlock()
	for _, p := range procs {
		p.KillTree()
	}
	w.orphans.Kill()
	e2eproc.StopLaunches(t, ngsupBin, w.base)
	var left []e2eproc.Info
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left = e2eproc.RecordedLeftovers(w.base, w.since)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, p := range left {
		t.Errorf("cleanup: a process of the test's sandboxes is left after ngsup stop: %s", p)
	}
	e2eproc.KillLeftovers(left)
	for _, p := range procs {
		if lines := e2eproc.ErrorsIn(p.Errs.String()); len(lines) > 0 {
			t.Errorf("%s reported: %s", p.Name, strings.Join(lines, "; "))
		}
	}
	if t.Failed() {
		for _, p := range procs {
			t.Logf("--- %s stderr (tail) ---\n%s", p.Name, e2eproc.Tail(p.Errs.String(), 5000))
		}
	}
}

// checkpointDir is the folder the coordinator commits checkpoint id to.
func (w *world) checkpointDir(id string) string { return filepath.Join(w.dir, "checkpoints", id) }

// waitStepped waits until every rollout's session holds at least one step.
func (w *world) waitStepped(rollouts ...string) {
	w.t.Helper()
	w.waitSteps(1, rollouts...)
}

// waitSteps waits until every rollout's session holds at least n steps.
func (w *world) waitSteps(n int, rollouts ...string) {
	w.t.Helper()
	testkit.Eventually(w.t, fmt.Sprintf("every run has taken %d steps", n), func() (bool, string) {
		var missing []string
		for _, r := range rollouts {
			if len(e2eproc.SessionSteps(w.base, r)) < n {
				missing = append(missing, r)
			}
		}
		return len(missing) == 0, fmt.Sprintf("fewer steps: %v", missing)
	})
}

// restoredBy is what participant name restores of the next attempts keys:
// all of them, but the model none, since the fake harness calls no model
// and the model's ledger holds no row of any rollout.
func restoredBy(name string, keys ...string) []string {
	if name == modelEntry {
		return nil
	}
	return keys
}
