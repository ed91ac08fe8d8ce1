package e2e

// One test's world: a real `ngdriver owner serve` on loopback, one (or, after
// a crash, a second) `ngdriver serve` on a config file the test wrote, the
// control-plane controller, and the cleanup that leaves nothing running.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/internal/testkit"
)

// waitLimit bounds every wait on a state in these tests: generous, never a
// statement about speed.
const waitLimit = 2 * time.Minute

// driverName is the participant name every test's driver has.
const driverName = "drv-e2e"

// options shape a test's driver config.
type options struct {
	maxRuns  int
	shutdown string // shutdown_timeout
	steps    int    // fake defaults
	stepS    float64
	// removeSandboxes runs the owner as it runs by default, removing a
	// session's sandbox when the session ends; otherwise it keeps them
	// (--keep-sandboxes) for the tests that read them afterwards.
	removeSandboxes bool
}

// env is one test's owner, drivers, folders and controller.
type env struct {
	t      *testing.T
	dir    string // the test's folder
	base   string // the owner's (and the local backend's) base folder
	logs   string
	token  string
	prefix string // every rollout id of the test starts with it
	opts   options

	owner    *e2eproc.Proc   // the current owner
	owners   []*e2eproc.Proc // every owner started, the current one last
	ownerURL string
	cfgPath  string

	mu        sync.Mutex
	drivers   []*e2eproc.Proc
	driverURL string
	orphans   e2eproc.Orphans

	ctl   *controller
	own   *controller // the owner's control plane
	since uint64      // start time of the test's first process
}

// newEnv starts an owner and a driver for the test.
func newEnv(t *testing.T, o options) *env {
	t.Helper()
	if o.maxRuns == 0 {
		o.maxRuns = 16
	}
	if o.shutdown == "" {
		o.shutdown = "30s"
	}
	if o.steps == 0 {
		o.steps = 10
	}
	if o.stepS == 0 {
		o.stepS = 0.3
	}
	dir := t.TempDir()
	var tok [16]byte
	rand.Read(tok[:])
	e := &env{
		t: t, dir: dir, base: filepath.Join(dir, "base"), logs: filepath.Join(dir, "logs"),
		token:  hex.EncodeToString(tok[:]),
		prefix: fmt.Sprintf("%s-%s", runTag, shortName(t.Name())+envSuffix(t)),
		opts:   o,
	}
	for _, d := range []string{e.base, e.logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(e.cleanup)
	e.startOwner("127.0.0.1:0")
	e.since = e.owner.Start
	e.cfgPath = filepath.Join(dir, "ngdriver.yaml")
	if err := os.WriteFile(e.cfgPath, []byte(e.config()), 0o644); err != nil {
		t.Fatal(err)
	}
	e.startDriver()
	return e
}

// startOwner starts `ngdriver owner serve` on the test's base, listening
// on listen, and points the owner's controller at it.
func (e *env) startOwner(listen string) *e2eproc.Proc {
	e.t.Helper()
	e.mu.Lock()
	name := fmt.Sprintf("owner%d", len(e.owners))
	if len(e.owners) == 0 {
		name = "owner"
	}
	e.mu.Unlock()
	args := []string{"owner", "serve", "--listen", listen, "--base", e.base, "--ngsup-dir", binDir, "--log-format", "json"}
	// The tests read the sandboxes after their runs (the sessions' steps,
	// the pids the fake harness recorded): keep them, unless asked not to.
	if !e.opts.removeSandboxes {
		args = append(args, "--keep-sandboxes")
	}
	p := e2eproc.StartProc(e.t, ngdriverBin, name, e.logs, e.tokenEnv(), args...)
	e.mu.Lock()
	e.owners = append(e.owners, p)
	e.owner = p
	e.mu.Unlock()
	e.ownerURL = p.URL(e.t)
	e.own = &controller{name: "owner", url: e.ownerURL, token: e.token}
	return p
}

// crashAll kills the driver and the owner with SIGKILL, each alone, as a
// host losing both processes would; what they had started is remembered
// and ended at cleanup. Neither is started again.
func (e *env) crashAll() {
	e.t.Helper()
	e.crashDriver()
	e.orphans.Add(e.owner.PID())
	if err := syscall.Kill(e.owner.PID(), syscall.SIGKILL); err != nil {
		e.t.Fatalf("kill the owner: %v", err)
	}
	if _, ok := e.owner.WaitExit(30 * time.Second); !ok {
		e.t.Fatal("the owner did not die from SIGKILL")
	}
}

// restartOwner starts a fresh owner on the same base at the same address
// (the driver's config names it) after crashAll.
func (e *env) restartOwner() *e2eproc.Proc {
	e.t.Helper()
	return e.startOwner(strings.TrimPrefix(e.ownerURL, "http://"))
}

// envsOf counts the envs each test made, so that a second env of one test
// (another deployment on the same host) gets rollout ids of its own.
var envsOf = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

// envSuffix is "" for a test's first env, "2", "3"... for the next ones.
func envSuffix(t *testing.T) string {
	envsOf.Lock()
	defer envsOf.Unlock()
	envsOf.n[t.Name()]++
	if n := envsOf.n[t.Name()]; n > 1 {
		return fmt.Sprint(n)
	}
	return ""
}

// shortName makes a test name a short plain word for ids.
func shortName(name string) string {
	name = strings.TrimPrefix(name, "Test")
	var b strings.Builder
	for _, r := range name {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
		if b.Len() >= 16 {
			break
		}
	}
	return b.String()
}

func (e *env) tokenEnv() []string { return []string{"NG_CONTROL_TOKEN=" + e.token} }

// config is the driver's YAML config (unknown keys are errors).
func (e *env) config() string {
	return fmt.Sprintf(`# written by the e2e test %s
listen: 127.0.0.1:0
name: %s
token_env: NG_CONTROL_TOKEN
max_runs: %d
adapter: fake
pause_at_checkpoints: true
stop_grace: 1s
shutdown_timeout: %s
ngsup_dir: %s
log_format: json
owner:
  url: %s
  timeout: 60s
  verify_timeout: 2m
  retries: 3
backends:
  local:
    base: %s
fake:
  steps: %d
  step_s: %g
`, e.t.Name(), driverName, e.opts.maxRuns, e.opts.shutdown, binDir, e.ownerURL, e.base, e.opts.steps, e.opts.stepS)
}

// startDriver starts `ngdriver serve` on the test's config and points the
// controller at it.
func (e *env) startDriver() *e2eproc.Proc {
	e.t.Helper()
	e.mu.Lock()
	n := len(e.drivers)
	e.mu.Unlock()
	p := e2eproc.StartProc(e.t, ngdriverBin, fmt.Sprintf("driver%d", n), e.logs, e.tokenEnv(), "serve", "--config", e.cfgPath)
	e.mu.Lock()
	e.drivers = append(e.drivers, p)
	e.mu.Unlock()
	u := p.URL(e.t)
	e.mu.Lock()
	e.driverURL = u
	e.mu.Unlock()
	e.ctl = &controller{name: "driver", url: u, token: e.token}
	return p
}

// driver is the current driver process.
func (e *env) driver() *e2eproc.Proc {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.drivers[len(e.drivers)-1]
}

// crashDriver kills the driver process alone with SIGKILL, as a crash
// would; what it had started is remembered and ended at cleanup.
func (e *env) crashDriver() {
	e.t.Helper()
	d := e.driver()
	e.orphans.Add(d.PID())
	if err := syscall.Kill(d.PID(), syscall.SIGKILL); err != nil {
		e.t.Fatalf("kill the driver: %v", err)
	}
	if _, ok := d.WaitExit(30 * time.Second); !ok {
		e.t.Fatal("the driver did not die from SIGKILL")
	}
}

// cleanup ends everything the test started and checks nothing is left.
func (e *env) cleanup() {
	t := e.t
	e.mu.Lock()
	procs := append(append([]*e2eproc.Proc{}, e.drivers...), e.owners...)
	e.mu.Unlock()
	for _, p := range procs {
		p.KillTree()
	}
	e.orphans.Kill()
	e2eproc.StopLaunches(t, ngsupBin, e.base)
	deadline := time.Now().Add(30 * time.Second)
	var left []e2eproc.Info
	for {
		left = e.leftovers()
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		for _, p := range left {
			t.Errorf("cleanup: a process of the test's sandboxes is left after ngsup stop: %s", p)
		}
		e2eproc.KillLeftovers(left)
	}
	for _, p := range procs {
		if lines := e2eproc.ErrorsIn(p.Errs.String()); len(lines) > 0 {
			t.Errorf("%s reported: %s", p.Name, strings.Join(lines, "; "))
		}
	}
	if t.Failed() {
		for _, p := range procs {
			t.Logf("--- %s stderr (tail) ---\n%s", p.Name, e2eproc.Tail(p.Errs.String(), 6000))
		}
	}
}

// leftovers lists the live processes of the test's launches: found by
// their tag or command line, or recorded by the fake harness.
func (e *env) leftovers() []e2eproc.Info {
	var out []e2eproc.Info
	seen := map[int]bool{}
	for _, p := range append(e2eproc.OwnProcesses(e.prefix), e2eproc.RecordedLeftovers(e.base, e.since)...) {
		if !seen[p.PID] {
			seen[p.PID] = true
			out = append(out, p)
		}
	}
	return out
}

// rollout returns the test's rollout id named name.
func (e *env) rollout(name string) string { return e.prefix + "-" + name }

// body is a run body of the fake adapter with a check that passes only
// when the workdir's progress holds every step exactly once, in order. It
// names its rollout as a caller that numbers its own dispatches does
// (_ng_rollout_id; attempt 0 unless _ng_attempt_index says otherwise).
func (e *env) body(rollout string, steps int, stepS float64) map[string]any {
	return map[string]any{
		"_ng_rollout_id": rollout,
		"task":           "count to " + fmt.Sprint(steps),
		"check":          fmt.Sprintf(`[ "$(cat progress)" = "$(seq -f 'step %%g' 1 %d)" ]`, steps),
		"fake":           map[string]any{"steps": steps, "step_s": stepS},
	}
}

// runReply is what a POST /run came back with.
type runReply struct {
	rollout string
	status  int
	body    []byte
	err     error
}

// result is the part of a run's result the tests read.
type result struct {
	RolloutID     string  `json:"_ng_rollout_id"` // the run body's, echoed by the owner's verify
	Reward        float64 `json:"reward"`
	FailureKind   string  `json:"failure_kind"`
	FailureReason string  `json:"failure_reason"`
	// Response is the NeMoGymResponse the fake adapter built from the
	// harness's session (harnesstest.CheckGymResponse reads it).
	Response json.RawMessage `json:"response"`
	// Fake is what the harness printed, from the fake_* fields beside it.
	Fake     fakeFields `json:"-"`
	Launches []launch   `json:"ng_harness_launches"`
}

// fakeFields are the fake adapter's fields of a /run reply.
type fakeFields struct {
	Text      string `json:"fake_text"`
	Steps     int    `json:"fake_steps"`
	FirstStep int    `json:"fake_first_step"`
	Finished  bool   `json:"fake_finished"`
}

// launch is one record of ng_harness_launches.
type launch struct {
	ID         string  `json:"id"`
	SandboxID  string  `json:"sandbox_id"`
	Resumed    bool    `json:"resumed"`
	Reason     string  `json:"reason"`
	DurationS  float64 `json:"duration_s"`
	Outcome    string  `json:"outcome"`
	ExitCode   int     `json:"exit_code"`
	Pauses     int     `json:"pauses"`
	Supervised bool    `json:"supervised"`
	Error      string  `json:"error"`
}

func (r runReply) String() string {
	if r.err != nil {
		return fmt.Sprintf("%s: %v", r.rollout, r.err)
	}
	return fmt.Sprintf("%s: HTTP %d %s", r.rollout, r.status, e2eproc.Tail(string(r.body), 2000))
}

// result decodes a 200 reply, failing the test otherwise. The response
// of a run whose harness finished must be a NeMoGymResponse whose last
// assistant message is the session's last step
// (harnesstest.CheckGymResponse), as a Gym trainer reads it.
func (r runReply) result(t *testing.T) result {
	t.Helper()
	var res result
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("run %s", r)
	}
	if err := json.Unmarshal(r.body, &res); err != nil {
		t.Fatalf("run %s: the result is not JSON: %v", r, err)
	}
	json.Unmarshal(r.body, &res.Fake)
	if res.Fake.Finished {
		harnesstest.CheckGymResponse(t, res.Response, "", fmt.Sprintf("step %d", res.Fake.Steps))
	}
	return res
}

// postRun posts a run body (a JSON value, or a string sent as is) to path
// on url (a driver) and waits for the reply.
func postRun(ctx context.Context, url, path, rollout string, body any) runReply {
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	default:
		data, _ = json.Marshal(b)
	}
	rep := runReply{rollout: rollout}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(string(data)))
	if err != nil {
		rep.err = err
		return rep
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		rep.err = err
		return rep
	}
	defer resp.Body.Close()
	rep.status = resp.StatusCode
	rep.body, rep.err = io.ReadAll(resp.Body)
	return rep
}

// startRun posts a run in the background; the reply arrives on the channel.
func (e *env) startRun(path, rollout string, body any) <-chan runReply {
	ch := make(chan runReply, 1)
	url := e.ctl.url
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	go func() {
		defer cancel()
		ch <- postRun(ctx, url, path, rollout, body)
	}()
	return ch
}

// await waits for a background run's reply.
func await(t *testing.T, ch <-chan runReply) runReply {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(waitLimit):
		t.Fatal("a run did not return in time")
		return runReply{}
	}
}

// health is /healthz's answer.
type health struct {
	OK    bool   `json:"ok"`
	Phase string `json:"phase"`
	Runs  int    `json:"runs"`
}

func (e *env) health() health {
	e.t.Helper()
	return e.healthOf(e.t)
}

// healthOf is health failing t, a subtest of the env's test.
func (e *env) healthOf(t *testing.T) health {
	t.Helper()
	resp, err := http.Get(e.ctl.url + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	defer resp.Body.Close()
	var h health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: HTTP %d, %v", resp.StatusCode, err)
	}
	return h
}

// waitStepped waits until every rollout's session holds at least one step.
func (e *env) waitStepped(rollouts ...string) {
	e.t.Helper()
	testkit.Eventually(e.t, "every run has taken a step", func() (bool, string) {
		var missing []string
		for _, r := range rollouts {
			if len(e2eproc.SessionSteps(e.base, r)) == 0 {
				missing = append(missing, r)
			}
		}
		return len(missing) == 0, fmt.Sprintf("no step yet: %v", missing)
	})
}
