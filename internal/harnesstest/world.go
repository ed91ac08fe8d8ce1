package harnesstest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/syncbuf"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// World is one test's whole setup, built on a drivertest.Env (the local
// backend, namespace isolation): the Env's base folder and local backend,
// its lending owner (whose StopSandbox is the owner's own ngsup's) and its
// control, its ngsup, its log and its cleanup; and what is the real
// harnesses' own: a fake model server of the world's, the Observer of its
// runners, Extra, the harness binary's checks. Runners and participants
// are made per attempt, as a driver process would after a crash. A
// package's own world embeds it and adds its adapter.
type World struct {
	// T is the test.
	T *testing.T
	// Suite is the test process's setup.
	Suite *Suite
	// Env is the drivertest world the World is built on.
	Env *drivertest.Env
	// Rollout is the rollout id: the base folder's name (the Env's Tag),
	// carrying RunTag.
	Rollout string
	// Task and Check are the run body's task and check.
	Task, Check string
	// Model is the world's fake model server.
	Model *fakemodel.Server
	// Base is the world's folder (the local backend's base).
	Base string
	// Local is the world's local backend (Env.Local).
	Local *local.Backend
	// Owner is the world's lending owner (Env.LocalOwner).
	Owner *lending.Owner
	// OwnerCk is the owner's control plane, kind resources
	// (Env.OwnerControl).
	OwnerCk *gym.Control
	// Ng launches through ngsup (Env.Ngsup).
	Ng *launch.Ngsup
	// Log is the log of the driver, the owner and the fake model (Env.Log).
	Log *slog.Logger
	// Logs holds what Log wrote, printed when the test failed.
	Logs *syncbuf.Buffer
	// Obs counts what the world's runners report.
	Obs *Observer
	// Extra, if set, is read by Observe into Still.Extra: bytes of a
	// paused launch's sandbox that must not change (a harness's database).
	Extra func(sandboxID string) map[string][]byte

	harness, harnessBin string
}

// WorldOptions says what a world is made of.
type WorldOptions struct {
	// Name names the world in its folders and rollout.
	Name string
	// Model is the fake model's options (Logf is set to the world's log).
	Model fakemodel.Options
	// Harness names the harness in messages ("Codex"); HarnessBin is its
	// binary (host path, visible in sandboxes), which Harness checks the
	// launch's harness process runs.
	Harness, HarnessBin string
	// Task and Check are the run body's task and check.
	Task, Check string
}

// NewWorld makes a world for t. Its cleanup, on success or failure, is the
// Env's (it cancels the runs still going, stops every launch of every
// sandbox through `ngsup stop`, checks no process of the world is left and
// kills, by pidfd, any that is), then the model server's close.
func (s *Suite) NewWorld(t *testing.T, opt WorldOptions) *World {
	t.Helper()
	w := &World{T: t, Suite: s, Task: opt.Task, Check: opt.Check, Obs: &Observer{}, harness: opt.Harness, harnessBin: opt.HarnessBin}
	// The kernel names a process's executable with every symlink resolved
	// (.tools is often a link to another checkout's).
	if real, err := filepath.EvalSymlinks(opt.HarnessBin); err == nil {
		w.harnessBin = real
	}
	// The model's close is registered first, so that it runs after the
	// Env's cleanup stopped every launch that may still be talking to it.
	t.Cleanup(func() {
		if w.Model == nil {
			return
		}
		if t.Failed() {
			for i, r := range w.Model.Requests() {
				t.Logf("model request %d: %s", i+1, DescribeRequest(r))
			}
		}
		w.Model.Close()
	})
	// The rollout id is the base folder's name: unique, and it carries
	// RunTag, so Main's last look finds its launches by their tags.
	e := drivertest.NewWith(t, drivertest.Options{
		BasePattern: s.RunTag + "-" + opt.Name + "-",
		Verbose:     s.VerboseEnv != "" && os.Getenv(s.VerboseEnv) != "",
		LogTitle:    "log of the driver, the owner and the fake model",
	})
	w.Env, w.Rollout, w.Base, w.Local = e, e.Tag, e.Local.Base(), e.Local
	w.Owner, w.OwnerCk, w.Ng, w.Log, w.Logs = e.LocalOwner, e.OwnerControl, e.Ngsup, e.Log, e.LogBuffer()
	model := opt.Model
	model.Logf = func(format string, args ...any) { w.Log.Debug(fmt.Sprintf(format, args...)) }
	m := fakemodel.New(model)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	w.Model = m
	return w
}

// Runner wires a Runner as `ngdriver run` does (drivertest.Env.Runner),
// with a wrapped in RawResponses, the real harnesses' stop grace and the
// world's Observer.
func (w *World) Runner(a harness.Adapter, p *driver.Participant) *driver.Runner {
	rn := w.Env.Runner(RawResponses{a}, p)
	rn.StopGrace = 2 * time.Second
	rn.Observer = w.Obs
	return rn
}

// RawResponses is an adapter without its Gym shaping, so the result's
// response is the adapter's own (exit code, the whole session), which the
// tests read; a package's mustSucceed shapes it as `ngdriver serve` does
// and checks the Gym reply too.
type RawResponses struct {
	// A is the adapter.
	A harness.Adapter
}

// Name is the adapter's.
func (r RawResponses) Name() string { return r.A.Name() }

// NewState is the adapter's.
func (r RawResponses) NewState(ro string, attempt int, sb harness.LentSandbox) (json.RawMessage, error) {
	return r.A.NewState(ro, attempt, sb)
}

// ResumeDecision is the adapter's.
func (r RawResponses) ResumeDecision(ctx context.Context, sb harness.LentSandbox, st json.RawMessage, ro string, attempt int) (harness.Decision, error) {
	return r.A.ResumeDecision(ctx, sb, st, ro, attempt)
}

// Launch is the adapter's.
func (r RawResponses) Launch(ctx context.Context, lc harness.LaunchContext) (harness.LaunchSpec, error) {
	return r.A.Launch(ctx, lc)
}

// Response is the adapter's own, unshaped.
func (r RawResponses) Response(ctx context.Context, sb harness.LentSandbox, st json.RawMessage, res harness.HarnessResult) (json.RawMessage, error) {
	return r.A.Response(ctx, sb, st, res)
}

// PausesAtCheckpoints is the adapter's (false if it does not say).
func (r RawResponses) PausesAtCheckpoints() bool {
	p, ok := r.A.(harness.PausesAtCheckpoints)
	return ok && p.PausesAtCheckpoints()
}

// Body is the run body of the world's rollout, with its task and check.
func (w *World) Body() json.RawMessage {
	data, err := json.Marshal(map[string]any{"rollout_id": w.Rollout, "task": w.Task, "check": w.Check})
	if err != nil {
		panic(err)
	}
	return data
}

// Run is one attempt of the rollout, running in the background (a
// drivertest.Handle: the Env's cleanup cancels it if it is still going).
type Run struct {
	// Attempt is the attempt it runs.
	Attempt int
	h       *drivertest.Handle
}

// Cancel cancels the run with cause (driver.ErrCrashed: as if the driver
// process crashed, nothing is cleaned up).
func (h *Run) Cancel(cause error) { h.h.Cancel(cause) }

// Start runs attempt of the rollout on rn in the background.
func (w *World) Start(rn *driver.Runner, attempt int) *Run {
	return &Run{Attempt: attempt, h: w.Env.Start(rn, w.Rollout, attempt, w.Body())}
}

// Wait waits for the run to return; past Patience the test fails.
func (w *World) Wait(h *Run) (json.RawMessage, error) {
	w.T.Helper()
	select {
	case <-h.h.Done():
		return h.h.Wait(w.T)
	case <-time.After(w.Suite.Patience):
		w.T.Fatalf("attempt %d did not return within %s", h.Attempt, w.Suite.Patience)
		return nil, nil
	}
}

// Verdict is what every run's result holds whatever the harness: the
// owner's verdict and the launch log.
type Verdict struct {
	// Reward is the owner's reward.
	Reward float64 `json:"reward"`
	// FailureKind and FailureReason say why a run failed.
	FailureKind   string `json:"failure_kind"`
	FailureReason string `json:"failure_reason"`
	// Launches is the launch log.
	Launches []driver.LaunchRecord `json:"ng_harness_launches"`
}

// MustSucceed waits for the run, which must return a JSON result with
// reward 1 (the owner's check held in the workdir of the current
// sandbox). It decodes the result into an R (a package's result type,
// embedding Verdict), hands it and the adapter's response (the result's
// "response") to check, which checks what is the harness's own, and
// returns it.
func MustSucceed[R any](w *World, h *Run, check func(r R, response json.RawMessage)) R {
	w.T.Helper()
	raw, err := w.Wait(h)
	if err != nil {
		w.T.Fatalf("attempt %d failed: %v", h.Attempt, err)
	}
	var v Verdict
	var r R
	var whole struct {
		Response json.RawMessage `json:"response"`
	}
	for _, into := range []any{&v, &r, &whole} {
		if err := json.Unmarshal(raw, into); err != nil {
			w.T.Fatalf("attempt %d: the result is not JSON: %v\n%s", h.Attempt, err, raw)
		}
	}
	if v.Reward != 1 {
		w.T.Errorf("reward %v (%s: %s), want 1 (verified)", v.Reward, v.FailureKind, v.FailureReason)
	}
	check(r, whole.Response)
	return r
}

// Sandboxes lists the world's sandbox ids, sorted.
func (w *World) Sandboxes() []string {
	ids := w.Env.Sandboxes()
	sort.Strings(ids)
	return ids
}

// LaunchID is the id the driver gives launch n of an attempt in a sandbox.
func (w *World) LaunchID(attempt, n int, sandboxID string) string {
	return driver.LaunchID(w.Rollout, attempt, n, sandboxID)
}

// LaunchDir is the host path of a launch's folder.
func (w *World) LaunchDir(sandboxID, launchID string) string {
	return w.Env.LaunchDir(sandboxID, launchID)
}

// Receipt reads a launch's receipt on the host.
func (w *World) Receipt(sandboxID, launchID string) *proto.Receipt {
	w.T.Helper()
	r, err := proto.ReadReceipt(w.LaunchDir(sandboxID, launchID))
	if err != nil {
		w.T.Fatalf("the receipt of launch %s in %s: %v", launchID, sandboxID, err)
	}
	return r
}

// WaitSandbox waits until the world has n sandboxes and returns the last
// (sandbox ids sort by generation within one session).
func (w *World) WaitSandbox(n int) string {
	w.T.Helper()
	var ids []string
	testkit.Eventually(w.T, fmt.Sprintf("%d sandboxes", n), func() (bool, string) {
		ids = w.Sandboxes()
		return len(ids) >= n, fmt.Sprintf("sandboxes %v", ids)
	})
	return ids[n-1]
}

// WaitProc waits until a process named comm is in the launch's tree (found
// by `ngsup tree`) and returns the tree.
func (w *World) WaitProc(sandboxID, launchID, comm string) proto.TreeResult {
	w.T.Helper()
	var tr proto.TreeResult
	testkit.Eventually(w.T, fmt.Sprintf("a %s process in launch %s", comm, launchID), func() (bool, string) {
		if _, err := os.Stat(filepath.Join(w.LaunchDir(sandboxID, launchID), proto.ReceiptFile)); err != nil {
			return false, "no receipt yet"
		}
		var err error
		tr, err = w.Suite.Tree(w.LaunchDir(sandboxID, launchID))
		if err != nil {
			return false, err.Error()
		}
		for _, p := range tr.Processes {
			if p.Comm == comm {
				return true, ""
			}
		}
		return false, fmt.Sprintf("tree %s", DescribeTree(tr))
	})
	return tr
}

// Observer counts what the runners of a world report (driver.Observer).
type Observer struct {
	mu                              sync.Mutex
	pauses, continues, failed, ends int
}

// LaunchEnded counts a launch's end.
func (o *Observer) LaunchEnded(driver.Outcome) { o.mu.Lock(); o.ends++; o.mu.Unlock() }

// Relaunched is not counted.
func (o *Observer) Relaunched(bool) {}

// Paused counts a confirmed pause.
func (o *Observer) Paused(_ time.Duration, ok bool, _ string) {
	o.mu.Lock()
	if ok {
		o.pauses++
	}
	o.mu.Unlock()
}

// Continued counts a continue that returned, and one that failed.
func (o *Observer) Continued(_ time.Duration, ok bool, _ string) {
	o.mu.Lock()
	if ok {
		o.continues++
	} else {
		o.failed++
	}
	o.mu.Unlock()
}

// WaitContinued waits until the runners have continued n paused launches
// (the continue returned): a crash or checkpoint after that does not race
// the continue of the last one.
func (w *World) WaitContinued(n int) {
	w.T.Helper()
	testkit.Eventually(w.T, fmt.Sprintf("%d continued launches", n), func() (bool, string) {
		w.Obs.mu.Lock()
		defer w.Obs.mu.Unlock()
		if w.Obs.failed > 0 {
			w.T.Fatalf("a continue failed")
		}
		return w.Obs.continues >= n, fmt.Sprintf("%d continued", w.Obs.continues)
	})
}

// WaitHeld waits until the fake model holds n requests.
func (w *World) WaitHeld(n int) {
	w.T.Helper()
	testkit.Eventually(w.T, fmt.Sprintf("%d held model requests", n), func() (bool, string) {
		got := w.Model.Held()
		return got >= n, fmt.Sprintf("%d held, %d requests", got, len(w.Model.Requests()))
	})
}

// DescribeTree is one line about a tree's processes (pid/ppid state comm).
func DescribeTree(tr proto.TreeResult) string {
	var parts []string
	for _, p := range tr.Processes {
		parts = append(parts, fmt.Sprintf("%d/%d %s %s", p.PID, p.PPID, p.State, p.Comm))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// request is a Gym request of checkpoint id, due within Patience.
func (w *World) request(id string) gym.Request {
	return gym.Request{CheckpointID: id, DeadlineTS: float64(time.Now().Add(w.Suite.Patience).UnixNano()) / 1e9}
}

// Prepare opens checkpoint id on the driver and the owner, in Gym's order:
// every run must park (its launch paused).
func (w *World) Prepare(p *driver.Participant, id string) {
	w.T.Helper()
	for _, c := range []*gym.Control{p.Control(), w.OwnerCk} {
		rep, err := c.Prepare(context.Background(), w.request(id))
		if err != nil {
			w.T.Fatalf("prepare %s: %v", id, err)
		}
		if rep.Phase != gym.PhasePrepared {
			w.T.Fatalf("prepare %s: %s not ready: %v", id, c.Status().Kind, rep.Report.Blockers)
		}
	}
}

// Committed is what commit wrote: the folder and the records read back.
type Committed struct {
	// Dir is the checkpoint folder.
	Dir string
	// Records are the driver's records read back.
	Records []gym.Record
}

// Commit commits the owner (it snapshots every open session's sandbox) and
// the driver into a folder of their own; it returns the snapshots (session
// -> snapshot id, from the owner's records) and the driver's records, read
// back from disk.
func (w *World) Commit(p *driver.Participant, id string) (map[string]string, Committed) {
	w.T.Helper()
	c := Committed{Dir: filepath.Join(w.T.TempDir(), id)}
	ctx := context.Background()
	for _, ctl := range []*gym.Control{p.Control(), w.OwnerCk} {
		if _, err := ctl.Commit(ctx, &gym.CommitRequest{Request: w.request(id), CheckpointDir: c.Dir}); err != nil {
			w.T.Fatalf("commit %s (%s): %v", id, ctl.Status().Kind, err)
		}
	}
	if _, err := gym.ReadState(c.Dir, gym.KindAgent, driver.DefaultInstance, func(r gym.Record) error {
		c.Records = append(c.Records, r)
		return nil
	}); err != nil {
		w.T.Fatalf("read back %s: %v", id, err)
	}
	snaps := map[string]string{}
	if _, err := gym.ReadState(c.Dir, gym.KindResources, drivertest.OwnerInstance, func(r gym.Record) error {
		var rec struct {
			SessionID string `json:"session_id"`
			State     struct {
				Snapshot string `json:"snapshot"`
			} `json:"state"`
		}
		if err := r.Decode(&rec); err != nil {
			return err
		}
		snaps[rec.SessionID] = rec.State.Snapshot
		return nil
	}); err != nil {
		w.T.Fatalf("read back the owner's records of %s: %v", id, err)
	}
	return snaps, c
}

// RestoreOwner restores the owner's records of what commit wrote (every
// session forked into a new sandbox for its next attempt) and resumes it.
func (w *World) RestoreOwner(id string, c Committed) {
	w.T.Helper()
	scope := make([]gym.EpisodeID, len(c.Records))
	for i, r := range c.Records {
		scope[i] = r.EpisodeID
	}
	ctx := context.Background()
	if _, err := w.OwnerCk.Restore(ctx, &gym.RestoreRequest{Request: w.request("restore-" + id), CheckpointDir: c.Dir, EpisodeIDs: scope}); err != nil {
		w.T.Fatalf("restore the owner from %s: %v", id, err)
	}
	if _, err := w.OwnerCk.Resume(ctx, w.request("restore-"+id)); err != nil {
		w.T.Fatalf("resume the owner after restoring %s: %v", id, err)
	}
}

// Restore installs what commit wrote into the fresh participant p, each
// record under its next attempt, and resumes.
func (w *World) Restore(p *driver.Participant, id string, c Committed) {
	w.T.Helper()
	scope := make([]gym.EpisodeID, len(c.Records))
	for i, r := range c.Records {
		scope[i] = r.EpisodeID
	}
	ctx := context.Background()
	if _, err := p.Control().Restore(ctx, &gym.RestoreRequest{Request: w.request("restore-" + id), CheckpointDir: c.Dir, EpisodeIDs: scope}); err != nil {
		w.T.Fatalf("restore %s: %v", id, err)
	}
	if _, err := p.Control().Resume(ctx, w.request("restore-"+id)); err != nil {
		w.T.Fatalf("resume after restoring %s: %v", id, err)
	}
}

// Resume opens checkpoint id on the driver and the owner: parked runs go on.
func (w *World) Resume(p *driver.Participant, id string) {
	w.T.Helper()
	for _, c := range []*gym.Control{p.Control(), w.OwnerCk} {
		if _, err := c.Resume(context.Background(), w.request(id)); err != nil {
			w.T.Fatalf("resume %s: %v", id, err)
		}
	}
}

// FileState is what "unchanged" means for one file of a sandbox.
type FileState struct {
	mode  fs.FileMode
	size  int64
	mtime time.Time
	sum   string // sha256 of a regular file's content
}

// Still is one look at a paused launch: its processes (the supervisor
// apart), every file of its sandbox, and the world's Extra bytes.
type Still struct {
	// At is when the look was taken.
	At time.Time
	// Supervisor is the launch's supervisor (ngsup run, never paused).
	Supervisor proctest.Stat
	// Procs are the launch's other processes, by pid.
	Procs map[int]proctest.Stat
	// Files are the sandbox's files by path relative to its host folder.
	Files map[string]FileState
	// Extra is what the world's Extra read, by name.
	Extra map[string][]byte
}

// Files hashes every file of the sandbox's host folder.
func (w *World) Files(sandboxID string) map[string]FileState {
	w.T.Helper()
	root := w.Local.HostPath(sandboxID)
	out := map[string]FileState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fsx := FileState{mode: info.Mode(), size: info.Size(), mtime: info.ModTime()}
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			fsx.sum = hex.EncodeToString(sum[:])
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = fsx
		return nil
	})
	if err != nil {
		w.T.Fatalf("walk the sandbox %s: %v", sandboxID, err)
	}
	return out
}

// Observe takes one look at a paused launch. Every process of the launch
// but the supervisor (ngsup run, which is never paused) must be stopped
// (state T).
func (w *World) Observe(sandboxID, launchID string) Still {
	w.T.Helper()
	tr, err := w.Suite.Tree(w.LaunchDir(sandboxID, launchID))
	if err != nil {
		w.T.Fatal(err)
	}
	s := Still{At: time.Now(), Procs: map[int]proctest.Stat{}}
	for _, p := range tr.Processes {
		st, ok := proctest.ReadStat(p.PID)
		if !ok || st.StartTicks != p.StartTicks {
			w.T.Errorf("process %d (%s) of launch %s went away while paused", p.PID, p.Comm, launchID)
			continue
		}
		if p.PID == tr.Root && tr.Supervised {
			s.Supervisor = settled(st)
			continue
		}
		if held, why := proctest.Held(p.PID, p.StartTicks); !held {
			w.T.Errorf("process %d (%s) of the paused launch %s is in state %c, want it held (stopped): %s", p.PID, st.Comm, launchID, st.State, why)
		}
		s.Procs[p.PID] = st
	}
	s.Files = w.Files(sandboxID)
	if w.Extra != nil {
		s.Extra = w.Extra(sandboxID)
	}
	return s
}

// settled reads the supervisor again until its CPU time stays the same for
// 300 ms (at most 3 s): right after a pause it may still be finishing the
// pause's bookkeeping (reaping its children's stop notices, the paused set's
// writes), and a clock tick charged for that work after the first look is
// not work done while paused. A supervisor that keeps working never
// settles: its last reading is returned, and the next look still differs.
func settled(st proctest.Stat) proctest.Stat {
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		again, ok := proctest.ReadStat(st.PID)
		if !ok || again.StartTicks != st.StartTicks {
			return st
		}
		if again.CPU() == st.CPU() {
			return again
		}
		st = again
	}
	return st
}

// Comms lists the command names of the processes of a look, sorted.
func Comms(s Still) []string {
	var out []string
	for _, p := range s.Procs {
		out = append(out, p.Comm)
	}
	sort.Strings(out)
	return out
}

// CompareStill fails the test for every change between two looks at a
// paused launch, and returns a summary of what stayed still; filesNote
// follows the count of unchanged files in it.
func CompareStill(t *testing.T, a, b Still, filesNote string) string {
	t.Helper()
	var changed []string
	for pid, pa := range a.Procs {
		pb, ok := b.Procs[pid]
		switch {
		case !ok:
			changed = append(changed, fmt.Sprintf("process %d (%s) is gone", pid, pa.Comm))
		case pa.CPU() != pb.CPU() || pa.StartTicks != pb.StartTicks:
			changed = append(changed, fmt.Sprintf("process %d (%s): CPU time %d -> %d ticks", pid, pa.Comm, pa.CPU(), pb.CPU()))
		}
	}
	for pid, pb := range b.Procs {
		if _, ok := a.Procs[pid]; !ok {
			changed = append(changed, fmt.Sprintf("process %d (%s) appeared", pid, pb.Comm))
		}
	}
	for name, fa := range a.Files {
		fb, ok := b.Files[name]
		switch {
		case !ok:
			changed = append(changed, "file "+name+" is gone")
		case fa != fb:
			changed = append(changed, fmt.Sprintf("file %s changed: %+v -> %+v", name, fa, fb))
		}
	}
	for name := range b.Files {
		if _, ok := a.Files[name]; !ok {
			changed = append(changed, "file "+name+" appeared")
		}
	}
	var extra []string
	for name, da := range a.Extra {
		if !bytes.Equal(da, b.Extra[name]) {
			changed = append(changed, fmt.Sprintf("%s changed (%d -> %d bytes)", name, len(da), len(b.Extra[name])))
		}
		extra = append(extra, fmt.Sprintf("%s %d B", name, len(da)))
	}
	// The supervisor is not paused (it stays to answer the launch's
	// verbs), but it does no work while it waits.
	if a.Supervisor.PID != 0 && (b.Supervisor.PID != a.Supervisor.PID || b.Supervisor.CPU() != a.Supervisor.CPU()) {
		changed = append(changed, fmt.Sprintf("the supervisor %d: CPU time %d -> %d ticks", a.Supervisor.PID, a.Supervisor.CPU(), b.Supervisor.CPU()))
	}
	for _, c := range changed {
		t.Errorf("while paused (%s apart): %s", b.At.Sub(a.At).Round(time.Millisecond), c)
	}
	var procs []string
	for _, p := range a.Procs {
		procs = append(procs, fmt.Sprintf("%d %s cpu=%d", p.PID, p.Comm, p.CPU()))
	}
	sort.Strings(procs)
	sort.Strings(extra)
	same := ""
	if len(extra) > 0 {
		same = "; " + strings.Join(extra, ", ") + " byte-identical"
	}
	return fmt.Sprintf("%s apart: %d processes stopped with unchanged CPU times [%s]; %d files unchanged%s%s; the supervisor %d (not paused) cpu %d -> %d",
		b.At.Sub(a.At).Round(time.Millisecond), len(a.Procs), strings.Join(procs, ", "), len(a.Files), filesNote, same,
		a.Supervisor.PID, a.Supervisor.CPU(), b.Supervisor.CPU())
}
