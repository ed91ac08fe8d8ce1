package drivertest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/cgrouptest"
	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/syncbuf"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// Patience is how long a test waits for something that should happen (a
// generous deadline, never an assertion about speed).
const Patience = 3 * time.Minute

// StopGrace is the SIGINT-to-SIGKILL grace the tests' runners use.
const StopGrace = 500 * time.Millisecond

// Main builds the static ngsup once for the test binary (testkit.Build),
// and the fake docker or kubectl client when BackendEnv names it, runs the
// tests and removes them. Call it from TestMain. (An Env on a fake client
// Main did not build builds it, once, when the Env is made.)
func Main(m *testing.M) {
	programs := []string{"ngsup"}
	if b := os.Getenv(BackendEnv); b == "docker" || b == "kubectl" {
		programs = append(programs, b)
	}
	os.Exit(testkit.Main(m, programs...))
}

// NgsupDir is the folder of the ngsup Main built.
func NgsupDir() string {
	if bin := testkit.Bin("ngsup"); bin != "" {
		return filepath.Dir(bin)
	}
	return ""
}

// Env is one test's world: a local backend in the test's temporary folder,
// the backend it runs on (the local one, or one whose sandboxes are kept in
// it), a lending owner on that backend, and ngsup. Make it with New or
// NewOn.
type Env struct {
	T *testing.T
	// Name is the backend the Env runs on, as BackendEnv names it
	// ("local" when none is named).
	Name string
	// Local is the local backend in the test's temporary folder: the
	// backend the Env runs on, or the store of its fakes' sandboxes.
	Local *local.Backend
	// Backend wraps the backend named Name for the Runner: it records
	// every exec and upload.
	Backend *Backend
	// Lender is what the owner lends the sandboxes of (the backend's
	// create, snapshot, fork and remove).
	Lender sandbox.Lender
	// OpenSandbox is the fake OpenSandbox server of the backend
	// "opensandbox" (nil on any other): its fault modes and what it saw.
	OpenSandbox *fakeexecd.Server
	// LocalOwner is the real owner; Owner wraps it for the Runner.
	LocalOwner *lending.Owner
	Owner      *Owner
	// OwnerControl is the owner's checkpoint control plane (kind
	// resources, instance OwnerInstance).
	OwnerControl *gym.Control
	// Ngsup is the driver's ngsup, which the Runners of Runner share.
	Ngsup *launch.Ngsup
	// OwnerNgsup is the owner's own ngsup (its StopSandbox, and its
	// KillSandbox of a sandbox a restore replaced), as the owner's
	// process would have: it knows nothing of the driver's uploads.
	OwnerNgsup *launch.Ngsup
	// Log is the driver's and the owner's log (see Logs).
	Log *slog.Logger
	// Tag is this Env's unique word; rollout ids from Rollout carry it.
	Tag string

	logs     *syncbuf.Buffer
	logTitle string
	binaries map[string]string // ngsup's builds, by GOARCH
	ckRoot   string
	view     hostView
	del      func(id string) error           // deletes a sandbox behind the owner's back
	sweep    func(ctx context.Context) error // removes what a remote backend holds, at cleanup
	mu       sync.Mutex
	handles  []*Handle
}

// New is NewOn the backend BackendEnv names (local when it is unset).
func New(t *testing.T) *Env {
	t.Helper()
	name := os.Getenv(BackendEnv)
	if name == BackendRealOpenSandbox {
		t.Fatalf("drivertest: %s=%s: the driver's tests look at the sandboxes from this machine; that backend is for NewOn", BackendEnv, name)
	}
	return NewOn(t, name)
}

// NewOn makes an Env on the backend named name (see BackendEnv; "" is
// local) and registers its cleanup (see the package comment). It skips the
// test when not running as root: the fixture needs the local backend's
// mount namespaces to find a sandbox's processes (but on
// BackendRealOpenSandbox, whose sandboxes are not on this machine).
func NewOn(t *testing.T, name string) *Env {
	t.Helper()
	return NewWith(t, Options{Backend: name})
}

// Options are what NewWith may change of an Env; the zero value is
// NewOn's local Env.
type Options struct {
	// Backend names the backend (see BackendEnv; "" is local).
	Backend string
	// BasePattern, when set, makes the local backend's base folder
	// os.MkdirTemp("", BasePattern) (removed at cleanup) instead of a
	// folder of the test's, and the Env's Tag that folder's name: a test
	// process that looks for what its tests left by a word of its own
	// (harnesstest's RunTag) puts the word in the pattern.
	BasePattern string
	// Verbose also streams the log to stderr as it is written (as
	// DRIVERTEST_VERBOSE does).
	Verbose bool
	// LogTitle heads the log printed when the test failed ("driver and
	// owner log" when empty).
	LogTitle string
}

// NewWith is NewOn with the options opt.
func NewWith(t *testing.T, opt Options) *Env {
	t.Helper()
	name := opt.Backend
	if name == "" {
		name = "local"
	}
	remote := name == BackendRealOpenSandbox
	if os.Geteuid() != 0 && !remote {
		t.Skip("the driver's tests need root: local sandboxes in mount namespaces of their own")
	}
	ngsupDir := NgsupDir()
	if ngsupDir == "" {
		t.Fatal("drivertest: ngsup was not built: call drivertest.Main (or testkit.Build) from TestMain")
	}
	binaries := launch.DefaultBinaries(ngsupDir)
	if len(binaries) == 0 {
		t.Fatalf("no ngsup in %s", ngsupDir)
	}
	var tb [4]byte
	_, _ = rand.Read(tb[:])
	// The tag starts with "t": a rollout id ending in "-a<digits>" is
	// refused (Gym reserves that ending for attempt keys).
	tag, base := "t"+hex.EncodeToString(tb[:]), t.TempDir()
	if opt.BasePattern != "" {
		dir, err := os.MkdirTemp("", opt.BasePattern)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		tag, base = filepath.Base(dir), dir
	}
	lb, err := local.New(base, local.Options{Isolation: local.IsolationAuto})
	if err != nil {
		t.Fatal(err)
	}
	if lb.Isolation() != local.IsolationNamespace && !remote {
		t.Skipf("the local backend runs without mount namespaces (%s)", lb.Isolation())
	}
	e := &Env{T: t, Name: name, Local: lb, Tag: tag, logs: &syncbuf.Buffer{}, logTitle: opt.LogTitle, ckRoot: t.TempDir(), binaries: binaries}
	if e.logTitle == "" {
		e.logTitle = "driver and owner log"
	}
	var w io.Writer = e.logs
	if opt.Verbose || os.Getenv("DRIVERTEST_VERBOSE") != "" {
		w = io.MultiWriter(e.logs, os.Stderr)
	}
	e.Log = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	e.withBackend(name)
	e.Ngsup, e.OwnerNgsup = e.NewNgsup(), e.NewNgsup()
	e.LocalOwner = lending.New(lending.Options{
		Sandboxes:   e.Lender,
		StopSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return e.OwnerNgsup.StopSandbox(ctx, sb) },
		KillSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return e.OwnerNgsup.StopSandboxGrace(ctx, sb, 0) },
		Logger:      e.Log,
	})
	e.Owner = NewOwner(e.LocalOwner)
	if e.OwnerControl, err = owner.NewControl(e.LocalOwner, gym.Config{Instance: OwnerInstance, LeaseGrace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cleanup)
	return e
}

// OwnerInstance is the owner's Gym instance name in the tests.
const OwnerInstance = "ngdriver_owner"

// CheckpointDir is the folder checkpoint id is committed into.
func (e *Env) CheckpointDir(id string) string { return filepath.Join(e.ckRoot, id) }

// Controls are the checkpoint participants of the driver p and the owner,
// in Gym's prepare order (agent, then resources).
func (e *Env) Controls(p *driver.Participant) []*gym.Control {
	return []*gym.Control{p.Control(), e.OwnerControl}
}

// Checkpoint takes checkpoint id of p and the owner as `ngdriver run`
// does (driver.Checkpoint): prepare, commit into CheckpointDir(id),
// resume after hold.
func (e *Env) Checkpoint(p *driver.Participant, id string, hold time.Duration) (driver.Committed, error) {
	return driver.Checkpoint(context.Background(), e.Controls(p), e.CheckpointDir(id), id, hold, e.Log)
}

// Restore restores the committed checkpoint c into p, a fresh participant
// (a new driver process), and the owner (driver.Restore).
func (e *Env) Restore(p *driver.Participant, c driver.Committed) error {
	return driver.Restore(context.Background(), e.Controls(p), c)
}

// Rollout returns a rollout id unique to this Env: name-<tag>.
func (e *Env) Rollout(name string) string { return name + "-" + e.Tag }

// Fake returns the fake adapter the tests use: it pauses at checkpoints,
// steps steps of stepS seconds.
func Fake(steps int, stepS float64) *fake.Adapter {
	return &fake.Adapter{Pause: true, Defaults: fake.Options{Steps: steps, StepSeconds: stepS}}
}

// NewNgsup is a fresh ngsup client, as a new driver (or owner) process
// has it: nothing known of earlier uploads.
func (e *Env) NewNgsup() *launch.Ngsup { return &launch.Ngsup{Binaries: e.binaries, Log: e.Log} }

// FreshRunner is Runner with an ngsup of its own (NewNgsup): the Runner of
// a new driver process, as after a crash.
func (e *Env) FreshRunner(a harness.Adapter, p *driver.Participant) *driver.Runner {
	rn := e.Runner(a, p)
	rn.Launchers = e.NewNgsup()
	return rn
}

// Runner returns a Runner wired as `ngdriver run` wires it: the adapter,
// the owner, the recording backend, the Env's ngsup and the participant,
// with the tests' short stop grace.
func (e *Env) Runner(a harness.Adapter, p *driver.Participant) *driver.Runner {
	return &driver.Runner{
		Adapter:     a,
		Owner:       e.Owner,
		Backends:    map[string]sandbox.Backend{e.Backend.Name(): e.Backend},
		Launchers:   e.Ngsup,
		Participant: p,
		Log:         e.Log,
		StopGrace:   StopGrace,
		// Generous, so a loaded machine does not cut a cancelled run's
		// cleanup short (the default is the grace plus 30 s).
		CancelBudget: Patience,
	}
}

// OwnSandbox is a Runner.OwnSandbox that makes a local sandbox (recorded
// like the lent ones) named own-<rollout>.
func (e *Env) OwnSandbox(ctx context.Context, rollout string) (harness.LentSandbox, error) {
	sb, err := e.Local.Create(ctx, "own-"+rollout)
	if err != nil {
		return harness.LentSandbox{}, err
	}
	d := sandbox.Descriptor{Provider: e.Local.Name(), SandboxID: sb.ID(), Workdir: sb.Workdir()}
	return harness.LentSandbox{Sandbox: e.Backend.Wrap(sb), Descriptor: d}, nil
}

// Task is a run body for the fake adapter and the lending owner: steps of
// stepS seconds, checked by the owner (every step in ./progress). extra
// fields are merged over it; extra["fake"] (a map) is merged into the fake
// options.
func Task(rollout string, steps int, stepS float64, extra map[string]any) json.RawMessage {
	fk := map[string]any{"steps": steps, "step_s": stepS}
	body := map[string]any{
		"rollout_id": rollout,
		"task":       "count to the end, one step at a time",
		"check":      fmt.Sprintf(`test "$(grep -c '^step' progress)" -ge %d`, steps),
	}
	for k, v := range extra {
		if k == "fake" {
			for fk2, fv := range v.(map[string]any) {
				fk[fk2] = fv
			}
			continue
		}
		body[k] = v
	}
	body["fake"] = fk
	data, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return data
}

// Handle is a run started in the background.
type Handle struct {
	Rollout string
	Attempt int
	cancel  context.CancelCauseFunc
	done    chan struct{}
	result  json.RawMessage
	err     error
	ended   time.Time
}

// Start runs req on rn in the background. The Env's cleanup cancels it if
// it is still running.
func (e *Env) Start(rn *driver.Runner, rollout string, attempt int, body json.RawMessage) *Handle {
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &Handle{Rollout: rollout, Attempt: attempt, cancel: cancel, done: make(chan struct{})}
	e.mu.Lock()
	e.handles = append(e.handles, h)
	e.mu.Unlock()
	go func() {
		defer close(h.done)
		h.result, h.err = rn.Run(ctx, driver.RunRequest{RolloutID: rollout, Attempt: attempt, Body: body})
		h.ended = time.Now()
	}()
	return h
}

// Cancel cancels the run with cause.
func (h *Handle) Cancel(cause error) { h.cancel(cause) }

// Done is closed when Run has returned.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Wait waits (up to Patience) for Run to return and returns what it did.
func (h *Handle) Wait(t testing.TB) (json.RawMessage, error) {
	t.Helper()
	select {
	case <-h.done:
		return h.result, h.err
	case <-time.After(Patience):
		t.Fatalf("run %s (attempt %d) did not return within %s", h.Rollout, h.Attempt, Patience)
		return nil, nil
	}
}

// MustSucceed waits for the run and parses its result; the test fails if
// the run failed.
func (h *Handle) MustSucceed(t testing.TB) Result {
	t.Helper()
	raw, err := h.Wait(t)
	if err != nil {
		t.Fatalf("run %s (attempt %d) failed: %v", h.Rollout, h.Attempt, err)
	}
	return ParseResult(t, raw)
}

// Result is a run's result JSON, as the fake adapter and the lending owner
// make it.
type Result struct {
	Reward      float64 `json:"reward"`
	FailureKind string  `json:"failure_kind"`
	// Response is the NeMoGymResponse the fake adapter built from the
	// harness's session.
	Response json.RawMessage `json:"response"`
	// Fake is what the fake harness printed: the fake_* fields beside
	// the response.
	Fake      FakeFields            `json:"-"`
	Launches  []driver.LaunchRecord `json:"ng_harness_launches"`
	RolloutID string                `json:"rollout_id"`
	Raw       json.RawMessage       `json:"-"`
}

// FakeFields are the fake adapter's fields of a result (fake.GymRunFields).
type FakeFields struct {
	Text      string `json:"fake_text"`
	Steps     int    `json:"fake_steps"`
	FirstStep int    `json:"fake_first_step"`
	Task      string `json:"fake_task"`
	Finished  bool   `json:"fake_finished"`
	Error     string `json:"fake_error"`
}

// ParseResult decodes a result; ng_harness_launches must be there.
func ParseResult(t testing.TB, raw json.RawMessage) Result {
	t.Helper()
	var r Result
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("the result is not what the driver returns: %v\n%s", err, raw)
	}
	_ = json.Unmarshal(raw, &r.Fake)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	if _, ok := m["ng_harness_launches"]; !ok {
		t.Fatalf("the result has no ng_harness_launches: %s", raw)
	}
	r.Raw = raw
	return r
}

// Cookies returns the cookies of rollout's latest seed.
func (e *Env) Cookies(rollout string) owner.Cookies {
	e.T.Helper()
	cs := e.Owner.Cookies(rollout)
	if len(cs) == 0 {
		e.T.Fatalf("rollout %s was never seeded", rollout)
	}
	return cs[len(cs)-1]
}

// Session returns what the owner knows of rollout's latest session.
func (e *Env) Session(rollout string) lending.SessionInfo {
	e.T.Helper()
	info, err := e.LocalOwner.Session(e.Cookies(rollout))
	if err != nil {
		e.T.Fatal(err)
	}
	return info
}

// HostPath is where a sandbox's folder (its mount point, which holds its
// root and workdir) is on this machine.
func (e *Env) HostPath(sandboxID string) string { return e.view.folder(sandboxID) }

// Open connects to one of the Env's sandboxes, through its backend.
func (e *Env) Open(sandboxID string) (sandbox.Sandbox, error) {
	return e.view.open(context.Background(), sandboxID)
}

// HostOf maps a path inside sandboxID to its host path.
func (e *Env) HostOf(sandboxID, inside string) string {
	e.T.Helper()
	p, err := hostOf(e.view, sandboxID, e.Local.MountPoint(), inside)
	if err != nil {
		e.T.Fatal(err)
	}
	return p
}

// LaunchDir is the host path of a launch's folder.
func (e *Env) LaunchDir(sandboxID, launchID string) string {
	return filepath.Join(e.HostPath(sandboxID), local.RootFolder, "launches", launchID)
}

// Receipt reads a launch's receipt on the host (nil when there is none
// yet). Its pids are host pids: in a container of a real engine the
// receipt's own (the container's) are mapped, and one whose process is gone
// reads 0.
func (e *Env) Receipt(sandboxID, launchID string) *proto.Receipt {
	dir := e.LaunchDir(sandboxID, launchID)
	r, err := proto.ReadReceipt(dir)
	if err != nil {
		return nil
	}
	host := e.view.hostPids(dir)
	r.SupervisorPID, r.HarnessPID, r.HarnessPGID = host(r.SupervisorPID), host(r.HarnessPID), host(r.HarnessPGID)
	return r
}

// FakeSessions lists the host folders of rollout's fake sessions in the
// sandbox, oldest first.
func (e *Env) FakeSessions(sandboxID, rollout string) []string {
	pattern := filepath.Join(e.HostPath(sandboxID), local.RootFolder, "state", "fake", rollout+"-a*-*")
	matches, _ := filepath.Glob(pattern)
	sort.Slice(matches, func(i, j int) bool {
		a, _ := os.Stat(matches[i])
		b, _ := os.Stat(matches[j])
		if a == nil || b == nil {
			return matches[i] < matches[j]
		}
		return a.ModTime().Before(b.ModTime())
	})
	return matches
}

// SessionOf is the host folder of the fake session a harness bookmark's
// state names, in sandboxID.
func (e *Env) SessionOf(sandboxID string, state json.RawMessage) string {
	e.T.Helper()
	var st fake.State
	if err := json.Unmarshal(state, &st); err != nil || st.SessionDir == "" {
		e.T.Fatalf("the bookmark's state %s names no fake session", state)
	}
	return e.HostOf(sandboxID, st.SessionDir)
}

// WaitSession waits until rollout has a fake session in the sandbox and
// returns its host folder (the newest).
func (e *Env) WaitSession(sandboxID, rollout string) string {
	e.T.Helper()
	var dir string
	testkit.Eventually(e.T, "a fake session of "+rollout, func() (bool, string) {
		s := e.FakeSessions(sandboxID, rollout)
		if len(s) == 0 {
			return false, "none in " + sandboxID
		}
		dir = s[len(s)-1]
		return true, ""
	})
	return dir
}

// Steps is fake.Steps, the fake harness's steps reader: the numbers of
// the steps the session at hostSessionDir has taken, in order.
func Steps(hostSessionDir string) []int { return fake.Steps(hostSessionDir) }

// WaitSteps waits until the session holds at least n steps.
func (e *Env) WaitSteps(hostSessionDir string, n int) {
	e.T.Helper()
	testkit.Eventually(e.T, fmt.Sprintf("%d steps in %s", n, hostSessionDir), func() (bool, string) {
		got := Steps(hostSessionDir)
		return len(got) >= n, fmt.Sprintf("steps %v", got)
	})
}

// CheckStepsOnce fails the test unless the session holds steps 1..n, each
// exactly once, in order: no model turn repeated, none lost.
func CheckStepsOnce(t testing.TB, hostSessionDir string, n int) {
	t.Helper()
	got := Steps(hostSessionDir)
	want := make([]int, n)
	for i := range want {
		want[i] = i + 1
	}
	if !slices.Equal(got, want) {
		t.Errorf("steps in %s: got %v, want each of 1..%d exactly once", hostSessionDir, got, n)
	}
}

// WaitPids waits until the session's pids file lists every kind in kinds
// and returns the processes (with their start times).
func (e *Env) WaitPids(hostSessionDir string, kinds ...string) []Proc {
	e.T.Helper()
	var procs []Proc
	testkit.Eventually(e.T, fmt.Sprintf("pids %v in %s", kinds, hostSessionDir), func() (bool, string) {
		var err error
		procs, err = readPids(hostSessionDir, e.view.hostPids(hostSessionDir))
		if err != nil {
			return false, err.Error()
		}
		have := Kinds(procs)
		for _, k := range kinds {
			if !slices.Contains(have, k) {
				return false, fmt.Sprintf("have %v", have)
			}
		}
		return true, ""
	})
	return procs
}

// CheckGone waits until none of procs is alive (pid gone, or its start time
// changed); the test fails naming the survivors.
func CheckGone(t testing.TB, what string, procs []Proc) {
	t.Helper()
	testkit.Eventually(t, what+": every process gone", func() (bool, string) {
		live := Live(procs)
		var names []string
		for _, p := range live {
			names = append(names, fmt.Sprintf("%s %s", p.Kind, proctest.Describe(p.PID)))
		}
		return len(live) == 0, fmt.Sprintf("alive: %v", names)
	})
}

// ProcsIn lists the host pids of the processes running in the given
// sandboxes (every sandbox of the Env when none is given): for local
// sandboxes, found by the bind mount of the sandbox's folder at the mount
// point in their mountinfo; for containers, by their pid namespace (the
// process that keeps the container running left out). Zombies are left
// out.
func (e *Env) ProcsIn(sandboxIDs ...string) []int { return e.view.procs(sandboxIDs...) }

// tagged lists the live processes whose launch tag names one of this Env's
// rollouts.
func (e *Env) tagged() []int {
	var out []int
	for _, pid := range proctest.Pids() {
		if tag := proctest.Tag(pid); tag != "" && strings.Contains(tag, e.Tag) {
			if st, ok := proctest.ReadStat(pid); ok && st.State != 'Z' {
				out = append(out, pid)
			}
		}
	}
	return out
}

// killOurs SIGKILLs each of pids that is still one of the Env's processes
// and returns their descriptions. A pidfd of each is opened first, then
// the Env's processes are listed once more: a pid in that list is the
// process the pidfd holds (it cannot have been reused since), and only
// those are signalled, through their pidfds. One listing for all of them:
// a listing a pid, as before, asked a real engine once per pid and
// container, and took minutes on a loaded machine.
func (e *Env) killOurs(pids []int) []string {
	fds := map[int]int{}
	for _, pid := range pids {
		if fd, err := unix.PidfdOpen(pid, 0); err == nil {
			fds[pid] = fd
		}
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	ours := append(e.ProcsIn(), e.tagged()...)
	var killed []string
	for _, pid := range pids {
		fd, ok := fds[pid]
		if !ok || !slices.Contains(ours, pid) {
			continue
		}
		d := proctest.Describe(pid)
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		_ = unix.PidfdSendSignal(fd, unix.SIGCONT, nil, 0)
		killed = append(killed, d)
	}
	return killed
}

// CheckNoProcs waits until no process runs in the sandboxes (every sandbox
// of the Env when none is given) except those keep accepts.
func (e *Env) CheckNoProcs(what string, sandboxIDs ...string) {
	e.T.Helper()
	testkit.Eventually(e.T, what+": no process left in the sandbox", func() (bool, string) {
		left := e.ProcsIn(sandboxIDs...)
		var names []string
		for _, pid := range left {
			names = append(names, proctest.Describe(pid))
		}
		return len(left) == 0, fmt.Sprintf("running: %v", names)
	})
}

// IsSupervisor reports whether pid is an ngsup process (its comm is
// ngsup-<hash>, truncated).
func IsSupervisor(pid int) bool {
	st, ok := proctest.ReadStat(pid)
	return ok && strings.HasPrefix(st.Comm, "ngsup")
}

// Sandboxes lists the ids of the sandboxes in the Env's backend.
func (e *Env) Sandboxes() []string { return e.view.sandboxes() }

// StopEverything runs `ngsup stop --id` (grace 1 s) on every launch folder
// of every sandbox of the Env. It is what the cleanup does first; tests use
// it too.
func (e *Env) StopEverything(ctx context.Context) error {
	var errs []error
	for _, id := range e.Sandboxes() {
		sb, err := e.view.open(ctx, id)
		if err != nil {
			continue
		}
		launches := filepath.Join(e.HostPath(id), local.RootFolder, "launches")
		ents, err := os.ReadDir(launches)
		if err != nil {
			continue
		}
		if _, err := e.Ngsup.Ensure(ctx, sb); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, en := range ents {
			if proto.ValidateID(en.Name()) != nil {
				continue
			}
			ref := launch.Ref{ID: en.Name(), Dir: path.Join(sb.Root(), "launches", en.Name()), SandboxID: id}
			if _, err := e.Ngsup.Launcher(false).Stop(ctx, sb, ref, time.Second); err != nil {
				errs = append(errs, fmt.Errorf("stop %s in %s: %w", en.Name(), id, err))
			}
		}
	}
	return errors.Join(errs...)
}

// wrapperSettle is how long cleanup lets the backend's exec wrappers end
// on their own.
const wrapperSettle = 3 * time.Second

// isExecWrapper tells a process running the opensandbox backend's exec
// script (opensandbox.Script), by the marker its text holds.
func isExecWrapper(pid int) bool {
	return strings.Contains(proctest.Cmdline(pid), "m='@ngx-")
}

// cleanup cancels the runs still going, stops every launch, and fails the
// test if any process of it is left (killing those, each identified first).
func (e *Env) cleanup() {
	t := e.T
	e.mu.Lock()
	handles := slices.Clone(e.handles)
	e.mu.Unlock()
	for _, h := range handles {
		h.cancel(errors.New("drivertest: the test ended"))
	}
	for _, h := range handles {
		select {
		case <-h.done:
		case <-time.After(Patience):
			t.Errorf("cleanup: run %s (attempt %d) did not return after its cancellation", h.Rollout, h.Attempt)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), Patience)
	defer cancel()
	if err := e.StopEverything(ctx); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	// An exec wrapper of the opensandbox backend (its script text carries
	// the "@ngx-" marker) can still be on its way out for a moment after
	// its exec returned (its timeout watcher leaves within a second of the
	// script): it is given wrapperSettle to go on its own. Anything else
	// is a leak at first sight.
	var left []string
	settle := time.Now().Add(wrapperSettle)
	for tries := 0; tries < 3; {
		pids := append(e.ProcsIn(), e.tagged()...)
		slices.Sort(pids)
		pids = slices.Compact(pids)
		if len(pids) == 0 {
			break
		}
		if time.Now().Before(settle) && !slices.ContainsFunc(pids, func(pid int) bool { return !isExecWrapper(pid) }) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		left = append(left, e.killOurs(pids)...)
		tries++
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("cleanup: processes of the test were still running after every launch was stopped (killed now): %v", left)
	}
	if e.sweep != nil {
		if err := e.sweep(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	// A sandbox deleted behind the owner's back leaves its launch's empty
	// cgroup: a real service would take it along.
	cgrouptest.RemoveEmpty(e.Tag)
	if t.Failed() {
		t.Logf("%s:\n%s", e.logTitle, e.logs.String())
	}
}

// WaitSeeded waits until rollout has been seeded n times and returns the
// owner's view of its latest session.
func (e *Env) WaitSeeded(rollout string, n int) lending.SessionInfo {
	e.T.Helper()
	testkit.Eventually(e.T, fmt.Sprintf("seed %d of %s", n, rollout), func() (bool, string) {
		got := len(e.Owner.Cookies(rollout))
		var failed []string
		for _, c := range e.Owner.Calls(rollout) {
			if c.Method == CallSeed && c.Err != nil {
				failed = append(failed, c.Err.Error())
			}
		}
		return got >= n, fmt.Sprintf("%d seeds; failed seeds: %q", got, failed)
	})
	return e.Session(rollout)
}

// Digest hashes every file under dir (path, mode, size and content), so a
// test can tell that nothing in a sandbox changed.
func Digest(t testing.TB, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v %d\n", p, fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(data)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("digest %s: %v", dir, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Logs returns the driver's and the owner's log of the test so far.
func (e *Env) Logs() string { return e.logs.String() }

// LogBuffer is what Log writes to.
func (e *Env) LogBuffer() *syncbuf.Buffer { return e.logs }
