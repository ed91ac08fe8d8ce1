package opencodee2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/syncbuf"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/localowner"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/opencode"
	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/test/fakemodel"
)

// patience bounds every wait on something that should happen: generous
// (OpenCode starts in 3 to 9 s alone, slower beside the other tests on 2
// cores), never an assertion about speed.
const patience = 4 * time.Minute

// The run body's task and check, and the texts of the scripted model.
const (
	task      = "run the tool"
	check     = "test -f done.txt"
	titleText = "OpenCode e2e"
	finalText = "all done"
)

// script is the fake model of these tests, deciding each reply from the
// request alone: the title request (no tools) gets a short title; a main
// turn whose history ends with an interrupted tool result gets a bash call
// running again; one ending with any other tool result gets the final
// text; any other main turn gets a bash call running first.
func script(first, again string) func(fakemodel.Request) fakemodel.Reply {
	call := func(cmd string) *fakemodel.ToolCall {
		args, err := json.Marshal(map[string]string{"command": cmd, "description": "Runs the scripted command"})
		if err != nil {
			panic(err)
		}
		return &fakemodel.ToolCall{Name: "bash", Arguments: string(args)}
	}
	return func(r fakemodel.Request) fakemodel.Reply {
		last := r.LastMessage()
		switch {
		case !r.HasTools:
			return fakemodel.Reply{Text: titleText}
		case last.Role == "tool" && strings.Contains(last.Content, "interrupted"):
			return fakemodel.Reply{ToolCall: call(again)}
		case last.Role == "tool":
			return fakemodel.Reply{Text: finalText}
		default:
			return fakemodel.Reply{ToolCall: call(first)}
		}
	}
}

// world is one test's whole setup: its own fake model server, a local
// backend in a folder of its own (namespace isolation), a local owner whose
// StopSandbox is ngsup's, and ngsup. Runners and participants are made per
// attempt, as a driver process would after a crash.
type world struct {
	t       *testing.T
	rollout string
	oc      string // the opencode binary (host path, visible in sandboxes)
	version string // its version
	task    string // the run body's task (default the task constant)
	model   *fakemodel.Server
	base    string
	local   *local.Backend
	owner   *localowner.Owner
	ownerCk *gym.Control // the owner's control plane (kind resources)
	ng      *launch.Ngsup
	log     *slog.Logger
	logs    *syncbuf.Buffer
	obs     *observer

	mu   sync.Mutex
	runs []*runHandle
}

// newWorld makes a world for t running OpenCode oc, named name and oc's
// version (in its folders and rollout). Its cleanup, on success or failure,
// cancels the runs still going, stops every launch of every sandbox through
// `ngsup stop`, checks no process of the world is left (and kills, by
// pidfd, any that is), then closes the model server.
func newWorld(t *testing.T, oc openCode, name string, model fakemodel.Options) *world {
	t.Helper()
	name += "-" + oc.version
	base, err := os.MkdirTemp("", runTag+"-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	// The rollout id is the base folder's name: unique, and it carries
	// runTag, so TestMain's last look finds its launches by their tags.
	w := &world{t: t, rollout: filepath.Base(base), oc: oc.bin, version: oc.version, task: task, base: base, logs: &syncbuf.Buffer{}, obs: &observer{}}
	var out io.Writer = w.logs
	if os.Getenv(verboseEnv) != "" {
		out = io.MultiWriter(w.logs, os.Stderr)
	}
	w.log = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", name)

	model.Logf = func(format string, args ...any) { w.log.Debug(fmt.Sprintf(format, args...)) }
	w.model = fakemodel.New(model)
	if err := w.model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.model.Close)

	w.local, err = local.New(base, local.Options{Isolation: local.IsolationNamespace})
	if err != nil {
		t.Fatal(err)
	}
	binaries := launch.FindBinaries(binDir, "ngsup")
	if len(binaries) == 0 {
		t.Fatalf("no ngsup in %s", binDir)
	}
	w.ng = &launch.Ngsup{Binaries: binaries, Log: w.log}
	w.owner = localowner.New(localowner.Options{
		Backend:     w.local,
		StopSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return w.ng.StopSandbox(ctx, sb) },
		Logger:      w.log,
	})
	ownerCk, err := owner.NewControl(w.owner, gym.Config{Instance: "ngdriver_owner", LeaseGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	w.ownerCk = ownerCk
	t.Cleanup(w.cleanup)
	return w
}

// adapter is the OpenCode adapter of the world: the host path of OpenCode,
// the fake model's URL, the built ngresume, and env added to OpenCode's
// environment.
func (w *world) adapter(env map[string]string) *opencode.Adapter {
	w.t.Helper()
	a, err := opencode.New(opencode.Options{
		OpenCode:       w.oc,
		ModelURL:       w.model.URL(),
		Env:            env,
		ResumeBinaries: launch.FindBinaries(binDir, "ngresume"),
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return a
}

// runner wires a Runner as `ngdriver run` does.
func (w *world) runner(a driver.Adapter, p *driver.Participant) *driver.Runner {
	return &driver.Runner{
		Adapter:     rawResponses{a},
		Owner:       w.owner,
		Backends:    map[string]sandbox.Backend{w.local.Name(): w.local},
		Launchers:   w.ng,
		Participant: p,
		Log:         w.log,
		StopGrace:   2 * time.Second,
		Observer:    w.obs,
	}
}

// rawResponses is the adapter without its Gym shaping, so the result's
// response is the adapter's own (exit code, the whole session export),
// which the tests read; mustSucceed shapes it as `ngdriver serve` does and
// checks the Gym reply too.
type rawResponses struct{ a driver.Adapter }

func (r rawResponses) Name() string { return r.a.Name() }
func (r rawResponses) NewState(ro string, attempt int, sb driver.LentSandbox) (json.RawMessage, error) {
	return r.a.NewState(ro, attempt, sb)
}
func (r rawResponses) ResumeDecision(ctx context.Context, sb driver.LentSandbox, st json.RawMessage, ro string, attempt int) (driver.Decision, error) {
	return r.a.ResumeDecision(ctx, sb, st, ro, attempt)
}
func (r rawResponses) Launch(ctx context.Context, lc driver.LaunchContext) (driver.LaunchSpec, error) {
	return r.a.Launch(ctx, lc)
}
func (r rawResponses) Response(ctx context.Context, sb driver.LentSandbox, st json.RawMessage, res driver.HarnessResult) (json.RawMessage, error) {
	return r.a.Response(ctx, sb, st, res)
}
func (r rawResponses) PausesAtCheckpoints() bool {
	p, ok := r.a.(driver.PausesAtCheckpoints)
	return ok && p.PausesAtCheckpoints()
}

// checkGymReply shapes the adapter's response as the /run reply carries it
// (a NeMoGymResponse from the session export, and opencode_* fields) and
// checks it: the final answer is the last output message, the usage is
// counted, the run finished and its export was found.
func (w *world) checkGymReply(response, body json.RawMessage) {
	w.t.Helper()
	resp, fields, err := w.adapter(nil).GymResult(response, body)
	if err != nil {
		w.t.Fatalf("the Gym response of the run: %v", err)
	}
	var gr struct {
		Object string `json:"object"`
		Model  string `json:"model"`
		Output []struct {
			Type    string `json:"type"`
			Role    string `json:"role"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage *struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(resp, &gr); err != nil {
		w.t.Fatalf("the Gym response is not JSON: %v\n%s", err, resp)
	}
	last := ""
	for _, it := range gr.Output {
		if it.Type == "message" && it.Role == "assistant" && len(it.Content) > 0 {
			last = it.Content[len(it.Content)-1].Text
		}
	}
	if gr.Object != "response" || gr.Model == "" || last != finalText || gr.Usage == nil || gr.Usage.TotalTokens == 0 {
		w.t.Errorf("the Gym response: object %q model %q last assistant text %q usage %+v; want response, a model, %q, counted", gr.Object, gr.Model, last, gr.Usage, finalText)
	}
	if string(fields["opencode_finished"]) != "true" || string(fields["opencode_export_found"]) != "true" || len(fields["opencode_results_fpath"]) < 3 {
		w.t.Errorf("the opencode_* fields %v: want finished, export found and its path", fields)
	}
}

// body is the run body of the world's rollout.
func (w *world) body() json.RawMessage {
	data, err := json.Marshal(map[string]any{"rollout_id": w.rollout, "task": w.task, "check": check})
	if err != nil {
		panic(err)
	}
	return data
}

// runHandle is one attempt of the rollout, running in the background.
type runHandle struct {
	attempt int
	cancel  context.CancelCauseFunc
	done    chan struct{}
	result  json.RawMessage
	err     error
}

// start runs attempt of the rollout on rn in the background.
func (w *world) start(rn *driver.Runner, attempt int) *runHandle {
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &runHandle{attempt: attempt, cancel: cancel, done: make(chan struct{})}
	w.mu.Lock()
	w.runs = append(w.runs, h)
	w.mu.Unlock()
	go func() {
		defer close(h.done)
		h.result, h.err = rn.Run(ctx, driver.RunRequest{RolloutID: w.rollout, Attempt: attempt, Body: w.body()})
	}()
	return h
}

// wait waits for the run to return.
func (w *world) wait(h *runHandle) (json.RawMessage, error) {
	w.t.Helper()
	select {
	case <-h.done:
		return h.result, h.err
	case <-time.After(patience):
		w.t.Fatalf("attempt %d did not return within %s", h.attempt, patience)
		return nil, nil
	}
}

// result is a run's result: the owner's verdict, OpenCode's response (what
// the adapter collected) and the launch log.
type result struct {
	Reward        float64 `json:"reward"`
	FailureKind   string  `json:"failure_kind"`
	FailureReason string  `json:"failure_reason"`
	Response      struct {
		ExitCode    int             `json:"exit_code"`
		SessionID   string          `json:"session_id"`
		Session     json.RawMessage `json:"session"`
		FinalText   string          `json:"final_text"`
		ExportError string          `json:"export_error"`
		StderrTail  string          `json:"stderr_tail"`
	} `json:"response"`
	Launches []driver.LaunchRecord `json:"ng_harness_launches"`
}

// mustSucceed waits for the run, which must return a result with reward 1
// (the owner's check found done.txt in the workdir of the current sandbox).
func (w *world) mustSucceed(h *runHandle) result {
	w.t.Helper()
	raw, err := w.wait(h)
	if err != nil {
		w.t.Fatalf("attempt %d failed: %v", h.attempt, err)
	}
	var r result
	if err := json.Unmarshal(raw, &r); err != nil {
		w.t.Fatalf("attempt %d: the result is not JSON: %v\n%s", h.attempt, err, raw)
	}
	if r.Reward != 1 {
		w.t.Errorf("reward %v (%s: %s), want 1 (verified)", r.Reward, r.FailureKind, r.FailureReason)
	}
	if r.Response.ExitCode != 0 || r.Response.ExportError != "" || r.Response.FinalText != finalText {
		w.t.Errorf("response: exit code %d, export error %q, final text %q (want 0, none, %q); stderr tail %q",
			r.Response.ExitCode, r.Response.ExportError, r.Response.FinalText, finalText, r.Response.StderrTail)
	}
	var whole struct {
		Response json.RawMessage `json:"response"`
	}
	if err := json.Unmarshal(raw, &whole); err == nil {
		w.checkGymReply(whole.Response, w.body())
	}
	return r
}

// cleanup: see newWorld.
func (w *world) cleanup() {
	t := w.t
	w.mu.Lock()
	runs := append([]*runHandle(nil), w.runs...)
	w.mu.Unlock()
	for _, h := range runs {
		h.cancel(errors.New("the test is over"))
	}
	for _, h := range runs {
		select {
		case <-h.done:
		case <-time.After(patience):
			t.Errorf("cleanup: attempt %d did not return within %s of its cancellation", h.attempt, patience)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, id := range w.sandboxes() {
		sb, err := w.local.Open(id)
		if err != nil {
			continue
		}
		if err := w.ng.StopSandbox(ctx, sb); err != nil {
			t.Errorf("cleanup: stop the launches of sandbox %s: %v", id, err)
		}
	}
	// A process just killed may take a moment to be reaped.
	var left []procInfo
	for deadline := time.Now().Add(30 * time.Second); ; {
		left = leftovers(w.ours)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("cleanup: processes of this test left after ngsup stop of every launch (now killed): %s", describeAll(left))
		for _, p := range left {
			killIdentified(p)
		}
	}
	if t.Failed() {
		t.Logf("log of the driver, the owner and the fake model:\n%s", w.logs.String())
		for i, r := range w.model.Requests() {
			t.Logf("model request %d: %s", i+1, describeRequest(r))
		}
	}
}

// ours reports whether a process belongs to this world: a launch tag of its
// rollout, or its namespace mounts one of its sandboxes at /sandbox.
func (w *world) ours(p procInfo) bool {
	return strings.Contains(p.tag, w.rollout) || strings.Contains(p.mountRoot, filepath.Base(w.base)+"/sandboxes/")
}

// sandboxes lists the world's sandbox ids, sorted.
func (w *world) sandboxes() []string {
	ents, _ := os.ReadDir(filepath.Join(w.local.Base(), "sandboxes"))
	var out []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// launchID is the id the driver gives launch n of an attempt in a sandbox.
func (w *world) launchID(attempt, n int, sandboxID string) string {
	return driver.LaunchID(w.rollout, attempt, n, sandboxID)
}

// launchDir is the host path of a launch's folder.
func (w *world) launchDir(sandboxID, launchID string) string {
	return filepath.Join(w.local.HostPath(sandboxID), local.RootFolder, "launches", launchID)
}

// receipt reads a launch's receipt on the host.
func (w *world) receipt(sandboxID, launchID string) *proto.Receipt {
	w.t.Helper()
	r, err := proto.ReadReceipt(w.launchDir(sandboxID, launchID))
	if err != nil {
		w.t.Fatalf("the receipt of launch %s in %s: %v", launchID, sandboxID, err)
	}
	return r
}

// eventually polls cond until it holds; past patience the test fails with
// what cond last said.
func (w *world) eventually(what string, cond func() (bool, string)) {
	w.t.Helper()
	deadline := time.Now().Add(patience)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: not within %s: %s", what, patience, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitSandbox waits until the world has n sandboxes and returns the last
// (sandbox ids sort by generation within one session).
func (w *world) waitSandbox(n int) string {
	w.t.Helper()
	var ids []string
	w.eventually(fmt.Sprintf("%d sandboxes", n), func() (bool, string) {
		ids = w.sandboxes()
		return len(ids) >= n, fmt.Sprintf("sandboxes %v", ids)
	})
	return ids[n-1]
}

// waitProc waits until a process named comm is in the launch's tree (found
// by `ngsup tree`) and returns the tree.
func (w *world) waitProc(sandboxID, launchID, comm string) proto.TreeResult {
	w.t.Helper()
	var tr proto.TreeResult
	w.eventually(fmt.Sprintf("a %s process in launch %s", comm, launchID), func() (bool, string) {
		if _, err := os.Stat(filepath.Join(w.launchDir(sandboxID, launchID), proto.ReceiptFile)); err != nil {
			return false, "no receipt yet"
		}
		var err error
		tr, err = tree(w.launchDir(sandboxID, launchID))
		if err != nil {
			return false, err.Error()
		}
		for _, p := range tr.Processes {
			if p.Comm == comm {
				return true, ""
			}
		}
		return false, fmt.Sprintf("tree %s", describeTree(tr))
	})
	return tr
}

// observer counts what the runners of a world report (driver.Observer).
type observer struct {
	mu                              sync.Mutex
	pauses, continues, failed, ends int
}

func (o *observer) LaunchEnded(driver.Outcome) { o.mu.Lock(); o.ends++; o.mu.Unlock() }
func (o *observer) Relaunched(bool)            {}
func (o *observer) Paused(_ time.Duration, ok bool, _ string) {
	o.mu.Lock()
	if ok {
		o.pauses++
	}
	o.mu.Unlock()
}
func (o *observer) Continued(_ time.Duration, ok bool, _ string) {
	o.mu.Lock()
	if ok {
		o.continues++
	} else {
		o.failed++
	}
	o.mu.Unlock()
}

// waitContinued waits until the runners have continued n paused launches
// (the continue returned): a crash or checkpoint after that does not race
// the continue of the last one.
func (w *world) waitContinued(n int) {
	w.t.Helper()
	w.eventually(fmt.Sprintf("%d continued launches", n), func() (bool, string) {
		w.obs.mu.Lock()
		defer w.obs.mu.Unlock()
		if w.obs.failed > 0 {
			w.t.Fatalf("a continue failed")
		}
		return w.obs.continues >= n, fmt.Sprintf("%d continued", w.obs.continues)
	})
}

// waitHeld waits until the fake model holds n requests.
func (w *world) waitHeld(n int) {
	w.t.Helper()
	w.eventually(fmt.Sprintf("%d held model requests", n), func() (bool, string) {
		got := w.model.Held()
		return got >= n, fmt.Sprintf("%d held, %d requests", got, len(w.model.Requests()))
	})
}

func describeTree(tr proto.TreeResult) string {
	var parts []string
	for _, p := range tr.Processes {
		parts = append(parts, fmt.Sprintf("%d/%d %s %s", p.PID, p.PPID, p.State, p.Comm))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// newParticipant is a participant for the OpenCode adapter.
func newParticipant() *driver.Participant {
	return driver.MustParticipant(driver.ParticipantConfig{Adapter: "opencode"})
}

func request(id string) gym.Request {
	return gym.Request{CheckpointID: id, DeadlineTS: float64(time.Now().Add(patience).UnixNano()) / 1e9}
}

// prepare opens checkpoint id on the driver and the owner, in Gym's order:
// every run must park (its launch paused).
func (w *world) prepare(p *driver.Participant, id string) {
	w.t.Helper()
	for _, c := range []*gym.Control{p.Control(), w.ownerCk} {
		rep, err := c.Prepare(context.Background(), request(id))
		if err != nil {
			w.t.Fatalf("prepare %s: %v", id, err)
		}
		if rep.Phase != gym.PhasePrepared {
			w.t.Fatalf("prepare %s: %s not ready: %v", id, c.Status().Kind, rep.Report.Blockers)
		}
	}
}

// committed is what commit wrote: the folder and the records read back.
type committed struct {
	dir     string
	records []gym.Record
}

// commit commits the owner (it snapshots every open session's sandbox) and
// the driver into a folder of their own; it returns the snapshots (session
// -> snapshot id, from the owner's records) and the driver's records, read
// back from disk.
func (w *world) commit(p *driver.Participant, id string) (map[string]string, committed) {
	w.t.Helper()
	c := committed{dir: filepath.Join(w.t.TempDir(), id)}
	ctx := context.Background()
	for _, ctl := range []*gym.Control{p.Control(), w.ownerCk} {
		if _, err := ctl.Commit(ctx, &gym.CommitRequest{Request: request(id), CheckpointDir: c.dir}); err != nil {
			w.t.Fatalf("commit %s (%s): %v", id, ctl.Status().Kind, err)
		}
	}
	if _, err := gym.ReadState(c.dir, gym.KindAgent, driver.DefaultInstance, func(r gym.Record) error {
		c.records = append(c.records, r)
		return nil
	}); err != nil {
		w.t.Fatalf("read back %s: %v", id, err)
	}
	snaps := map[string]string{}
	if _, err := gym.ReadState(c.dir, gym.KindResources, "ngdriver_owner", func(r gym.Record) error {
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
		w.t.Fatalf("read back the owner's records of %s: %v", id, err)
	}
	return snaps, c
}

// restoreOwner restores the owner's records of what commit wrote (every
// session forked into a new sandbox for its next attempt) and resumes it.
func (w *world) restoreOwner(id string, c committed) {
	w.t.Helper()
	scope := make([]gym.EpisodeID, len(c.records))
	for i, r := range c.records {
		scope[i] = r.EpisodeID
	}
	ctx := context.Background()
	if _, err := w.ownerCk.Restore(ctx, &gym.RestoreRequest{Request: request("restore-" + id), CheckpointDir: c.dir, EpisodeIDs: scope}); err != nil {
		w.t.Fatalf("restore the owner from %s: %v", id, err)
	}
	if _, err := w.ownerCk.Resume(ctx, request("restore-"+id)); err != nil {
		w.t.Fatalf("resume the owner after restoring %s: %v", id, err)
	}
}

// restore installs what commit wrote into the fresh participant p, each
// record under its next attempt, and resumes.
func (w *world) restore(p *driver.Participant, id string, c committed) {
	w.t.Helper()
	scope := make([]gym.EpisodeID, len(c.records))
	for i, r := range c.records {
		scope[i] = r.EpisodeID
	}
	ctx := context.Background()
	if _, err := p.Control().Restore(ctx, &gym.RestoreRequest{Request: request("restore-" + id), CheckpointDir: c.dir, EpisodeIDs: scope}); err != nil {
		w.t.Fatalf("restore %s: %v", id, err)
	}
	if _, err := p.Control().Resume(ctx, request("restore-"+id)); err != nil {
		w.t.Fatalf("resume after restoring %s: %v", id, err)
	}
}

// resume opens checkpoint id on the driver and the owner: parked runs go on.
func (w *world) resume(p *driver.Participant, id string) {
	w.t.Helper()
	for _, c := range []*gym.Control{p.Control(), w.ownerCk} {
		if _, err := c.Resume(context.Background(), request(id)); err != nil {
			w.t.Fatalf("resume %s: %v", id, err)
		}
	}
}

// fileState is what "unchanged" means for one file of a sandbox.
type fileState struct {
	mode  fs.FileMode
	size  int64
	mtime time.Time
	sum   string // sha256 of a regular file's content
}

// still is one look at a paused launch: its processes (the supervisor
// apart), every file of its sandbox, and the bytes of OpenCode's database.
type still struct {
	at         time.Time
	supervisor procStat
	procs      map[int]procStat
	files      map[string]fileState
	db         map[string][]byte // opencode.db, -wal, -shm by base name
}

// dbFiles reads opencode.db, -wal and -shm of every OpenCode data folder of
// the sandbox (host paths), by base name; the test fails unless there is
// exactly one database.
func (w *world) dbFiles(sandboxID string) map[string][]byte {
	w.t.Helper()
	dbs, _ := filepath.Glob(filepath.Join(w.local.HostPath(sandboxID), local.RootFolder, "state", "opencode", "*", "data", "opencode", "opencode.db"))
	if len(dbs) != 1 {
		w.t.Fatalf("OpenCode databases in %s: %v, want one", sandboxID, dbs)
	}
	out := map[string][]byte{}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		data, err := os.ReadFile(dbs[0] + suffix)
		if err != nil {
			w.t.Fatalf("read the database: %v", err)
		}
		out["opencode.db"+suffix] = data
	}
	return out
}

// files hashes every file of the sandbox's host folder.
func (w *world) files(sandboxID string) map[string]fileState {
	w.t.Helper()
	root := w.local.HostPath(sandboxID)
	out := map[string]fileState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fsx := fileState{mode: info.Mode(), size: info.Size(), mtime: info.ModTime()}
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
		w.t.Fatalf("walk the sandbox %s: %v", sandboxID, err)
	}
	return out
}

// observe takes one look at a paused launch. Every process of the launch
// but the supervisor (ngsup run, which is never paused) must be stopped
// (state T).
func (w *world) observe(sandboxID, launchID string) still {
	w.t.Helper()
	tr, err := tree(w.launchDir(sandboxID, launchID))
	if err != nil {
		w.t.Fatal(err)
	}
	s := still{at: time.Now(), procs: map[int]procStat{}}
	for _, p := range tr.Processes {
		st, ok := readStat(p.PID)
		if !ok || st.StartTicks != p.StartTicks {
			w.t.Errorf("process %d (%s) of launch %s went away while paused", p.PID, p.Comm, launchID)
			continue
		}
		if p.PID == tr.Root && tr.Supervised {
			s.supervisor = settled(st)
			continue
		}
		if st.State != 'T' && st.State != 't' {
			w.t.Errorf("process %d (%s) of the paused launch %s is in state %c, want T (stopped)", p.PID, st.Comm, launchID, st.State)
		}
		s.procs[p.PID] = st
	}
	s.files = w.files(sandboxID)
	s.db = w.dbFiles(sandboxID)
	return s
}

// settled reads the supervisor again until its CPU time stays the same for
// 300 ms (at most 3 s): right after a pause it may still be finishing the
// pause's bookkeeping (reaping its children's stop notices, the paused set's
// writes), and a clock tick charged for that work after the first look is
// not work done while paused. A supervisor that keeps working never
// settles: its last reading is returned, and the next look still differs.
func settled(st procStat) procStat {
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		again, ok := readStat(st.PID)
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

// compareStill fails the test for every change between two looks at a
// paused launch, and returns a summary of what stayed still.
func compareStill(t *testing.T, a, b still) string {
	t.Helper()
	var changed []string
	for pid, pa := range a.procs {
		pb, ok := b.procs[pid]
		switch {
		case !ok:
			changed = append(changed, fmt.Sprintf("process %d (%s) is gone", pid, pa.Comm))
		case pa.CPU() != pb.CPU() || pa.StartTicks != pb.StartTicks:
			changed = append(changed, fmt.Sprintf("process %d (%s): CPU time %d -> %d ticks", pid, pa.Comm, pa.CPU(), pb.CPU()))
		}
	}
	for pid, pb := range b.procs {
		if _, ok := a.procs[pid]; !ok {
			changed = append(changed, fmt.Sprintf("process %d (%s) appeared", pid, pb.Comm))
		}
	}
	for name, fa := range a.files {
		fb, ok := b.files[name]
		switch {
		case !ok:
			changed = append(changed, "file "+name+" is gone")
		case fa != fb:
			changed = append(changed, fmt.Sprintf("file %s changed: %+v -> %+v", name, fa, fb))
		}
	}
	for name := range b.files {
		if _, ok := a.files[name]; !ok {
			changed = append(changed, "file "+name+" appeared")
		}
	}
	for name, da := range a.db {
		if !bytes.Equal(da, b.db[name]) {
			changed = append(changed, fmt.Sprintf("%s changed (%d -> %d bytes)", name, len(da), len(b.db[name])))
		}
	}
	// The supervisor is not paused (it stays to answer the launch's
	// verbs), but it does no work while it waits.
	if a.supervisor.PID != 0 && (b.supervisor.PID != a.supervisor.PID || b.supervisor.CPU() != a.supervisor.CPU()) {
		changed = append(changed, fmt.Sprintf("the supervisor %d: CPU time %d -> %d ticks", a.supervisor.PID, a.supervisor.CPU(), b.supervisor.CPU()))
	}
	for _, c := range changed {
		t.Errorf("while paused (%s apart): %s", b.at.Sub(a.at).Round(time.Millisecond), c)
	}
	var procs []string
	for _, p := range a.procs {
		procs = append(procs, fmt.Sprintf("%d %s cpu=%d", p.PID, p.Comm, p.CPU()))
	}
	sort.Strings(procs)
	return fmt.Sprintf("%s apart: %d processes stopped with unchanged CPU times [%s]; %d files unchanged; opencode.db %d B, -wal %d B, -shm %d B byte-identical; the supervisor %d (not paused) cpu %d -> %d",
		b.at.Sub(a.at).Round(time.Millisecond), len(a.procs), strings.Join(procs, ", "), len(a.files),
		len(a.db["opencode.db"]), len(a.db["opencode.db-wal"]), len(a.db["opencode.db-shm"]),
		a.supervisor.PID, a.supervisor.CPU(), b.supervisor.CPU())
}
