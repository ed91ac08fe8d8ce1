package backends_e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

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
	"github.com/ngharness/ngharness/pkg/driver/sandbox/docker"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/kubectl"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/proto"
)

// Patience bounds every wait of a test (never an assertion on speed).
const Patience = 2 * time.Minute

// mountPoint is where every fake's sandbox folder appears inside it; the
// backends keep Root and Workdir below it.
const mountPoint = local.DefaultMountPoint

// backends are the backends every scenario runs over; local is the
// control.
var backends = []string{"local", "opensandbox", "docker", "kubectl"}

// world is one backend with everything around it that `ngdriver` and an
// owner would wire: the backend (wrapped to count uploads and record
// execs), an owner lending its sandboxes (lending.Owner on the backend's
// create/snapshot/fork/remove), ngsup, and the fake adapter.
type world struct {
	t    *testing.T
	name string
	// store is the folder whose sandboxes/ holds every sandbox's host
	// folder (the fakes keep them as local sandboxes do).
	store string
	// folder maps a sandbox id to its folder's name in store/sandboxes.
	folder func(id string) string
	// raw is the backend; rec wraps it for the runner.
	raw    sandbox.Backend
	rec    *recorder
	lender sandbox.Lender
	owner  *trackingOwner
	// ownerNgsup is the owner's ngsup (the owner is another process).
	ownerNgsup *launch.Ngsup
	// del deletes a sandbox behind the owner's back, through the service.
	del func(id string) error
	// osb is the fake OpenSandbox (opensandbox only).
	osb *fakeexecd.Server
	log *slog.Logger
	buf *syncbuf.Buffer

	mu       sync.Mutex
	handles  []*handle
	ownerCtl *gym.Control
}

func newWorld(t *testing.T, name string) *world {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the backends' fakes run sandboxes in mount namespaces of their own: they need root")
	}
	base := t.TempDir()
	w := &world{t: t, name: name, buf: &syncbuf.Buffer{}}
	var out io.Writer = w.buf
	if os.Getenv("BACKENDS_E2E_VERBOSE") != "" {
		out = io.MultiWriter(w.buf, os.Stderr)
	}
	w.log = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	root, work := mountPoint+"/"+local.RootFolder, mountPoint+"/"+local.WorkFolder
	w.folder = func(id string) string { return id }
	switch name {
	case "local":
		lb, err := local.New(base, local.Options{Isolation: local.IsolationNamespace})
		if err != nil {
			t.Fatal(err)
		}
		w.store, w.raw, w.lender = base, lb, lb.Lender()
		w.del = func(id string) error {
			// As a machine losing it: its processes die with its folder.
			fakeexecd.KillIn(lb.HostPath(id), lb.MountPoint())
			return lb.Remove(context.Background(), id)
		}
	case "opensandbox":
		srv, err := fakeexecd.Start(fakeexecd.Options{Base: base, APIKey: "e2e-key", Log: w.log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		b, err := opensandbox.New(opensandbox.Options{Server: srv.URL(), APIKey: "e2e-key", Image: "ubuntu:24.04",
			Root: root, Workdir: work, Poll: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		w.osb, w.store, w.raw, w.lender, w.del = srv, filepath.Join(base, "store"), b, b, srv.Delete
	case "docker":
		b, err := docker.New(docker.Options{Env: []string{"FAKECLI_BASE=" + base}, Image: "ubuntu:24.04", Root: root, Workdir: work})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(b.Client(), binDir) {
			t.Fatalf("the docker backend found %s, not the fake", b.Client())
		}
		w.store, w.raw, w.lender = base, b, b
		w.del = func(id string) error { return w.cli("docker", "rm", "-f", id) }
	case "kubectl":
		b, err := kubectl.New(kubectl.Options{Env: []string{"FAKECLI_BASE=" + base}, Namespace: "rollouts", Image: "ubuntu:24.04",
			Root: root, Workdir: work, SnapshotDir: filepath.Join(base, "tars")})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(b.Client(), binDir) {
			t.Fatalf("the kubectl backend found %s, not the fake", b.Client())
		}
		w.store, w.raw, w.lender = base, b, b
		w.folder = func(id string) string {
			ns, pod, _ := strings.Cut(id, "/")
			return "k8s-" + ns + "." + pod
		}
		w.del = func(id string) error {
			ns, pod, _ := strings.Cut(id, "/")
			return w.cli("kubectl", "delete", "pod", pod, "-n", ns, "--grace-period=0", "--force")
		}
	default:
		t.Fatalf("no backend %q", name)
	}
	w.rec = &recorder{inner: w.raw, uploads: map[string][]string{}}
	w.ownerNgsup = w.newNgsup()
	lo := lending.New(lending.Options{
		Sandboxes:   w.lender,
		StopSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return w.ownerNgsup.StopSandbox(ctx, sb) },
		KillSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return w.ownerNgsup.StopSandboxGrace(ctx, sb, 0) },
		Logger:      w.log,
	})
	w.owner = &trackingOwner{Owner: lo, cookies: map[string][]owner.Cookies{}}
	t.Cleanup(w.cleanup)
	return w
}

// cli runs the fake docker or kubectl as a person would, against this
// world's containers.
func (w *world) cli(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = append(os.Environ(), "FAKECLI_BASE="+w.store)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %v: %s", name, args, err, out)
	}
	return nil
}

// newNgsup is a fresh ngsup driver (a new driver process: nothing known of
// earlier uploads).
func (w *world) newNgsup() *launch.Ngsup {
	return &launch.Ngsup{Binaries: launch.DefaultBinaries(binDir), Log: w.log}
}

// hostFolder is the folder on this machine that is the sandbox's
// mount point.
func (w *world) hostFolder(id string) string {
	return filepath.Join(w.store, "sandboxes", w.folder(id))
}

// host maps a path inside a sandbox to this machine.
func (w *world) host(id, inside string) string {
	w.t.Helper()
	rel, ok := strings.CutPrefix(inside, mountPoint+"/")
	if !ok {
		w.t.Fatalf("%s is not below %s", inside, mountPoint)
	}
	return filepath.Join(w.hostFolder(id), rel)
}

// fakeAdapter is the fake adapter: it pauses at checkpoints.
func fakeAdapter() *fake.Adapter { return &fake.Adapter{Pause: true} }

// runner wires a Runner as `ngdriver serve` does, on the recording
// backend, with ng (a fresh Ngsup when nil).
func (w *world) runner(p *driver.Participant, ng *launch.Ngsup) *driver.Runner {
	if ng == nil {
		ng = w.newNgsup()
	}
	return &driver.Runner{
		Adapter:     fakeAdapter(),
		Owner:       w.owner,
		Backends:    map[string]sandbox.Backend{w.raw.Name(): w.rec},
		Launchers:   ng,
		Participant: p,
		Log:         w.log,
		StopGrace:   500 * time.Millisecond,
	}
}

// rollout is a rollout id unique to this test process and world.
func (w *world) rollout(name string) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	// "r" first: an id ending in "-a<digits>" is refused (Gym reserves it).
	return fmt.Sprintf("%s-%s-%s-r%s", name, w.name, runTag, hex.EncodeToString(b[:]))
}

// task is a run body for the fake adapter and the owner: steps of stepS
// seconds, checked by the owner (every step in ./progress).
func task(rollout, text string, steps int, stepS float64) json.RawMessage {
	body := map[string]any{
		"rollout_id":     rollout,
		"_ng_rollout_id": rollout, // the identity `ngdriver serve` reads, as Gym's collector sends it
		"task":           text,
		"check":          fmt.Sprintf(`test "$(grep -c '^step' progress)" -ge %d`, steps),
		"fake":           map[string]any{"steps": steps, "step_s": stepS},
	}
	data, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return data
}

// handle is a run going on in the background.
type handle struct {
	rollout string
	cancel  context.CancelCauseFunc
	done    chan struct{}
	result  json.RawMessage
	err     error
}

func (w *world) start(rn *driver.Runner, rollout string, attempt int, body json.RawMessage) *handle {
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &handle{rollout: rollout, cancel: cancel, done: make(chan struct{})}
	w.mu.Lock()
	w.handles = append(w.handles, h)
	w.mu.Unlock()
	go func() {
		defer close(h.done)
		h.result, h.err = rn.Run(ctx, driver.RunRequest{RolloutID: rollout, Attempt: attempt, Body: body})
	}()
	return h
}

func (h *handle) wait(t testing.TB) (json.RawMessage, error) {
	t.Helper()
	select {
	case <-h.done:
		return h.result, h.err
	case <-time.After(Patience):
		t.Fatalf("run %s did not return within %s", h.rollout, Patience)
		return nil, nil
	}
}

// result is a run's result as the fake adapter and the owner make it.
type result struct {
	Reward float64 `json:"reward"`
	// Fake is what the fake harness printed: the fake_* fields beside the
	// response (a NeMoGymResponse of its session).
	Fake     fakeFields            `json:"-"`
	Launches []driver.LaunchRecord `json:"ng_harness_launches"`
}

// fakeFields are the fake adapter's fields of a result.
type fakeFields struct {
	Steps     int    `json:"fake_steps"`
	FirstStep int    `json:"fake_first_step"`
	Task      string `json:"fake_task"`
	Error     string `json:"fake_error"`
}

func (h *handle) mustSucceed(t testing.TB) result {
	t.Helper()
	raw, err := h.wait(t)
	if err != nil {
		t.Fatalf("run %s failed: %v", h.rollout, err)
	}
	var r result
	json.Unmarshal(raw, &r.Fake)
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("the result of %s: %v: %s", h.rollout, err, raw)
	}
	if r.Reward != 1 {
		t.Fatalf("run %s was not verified: %s", h.rollout, raw)
	}
	return r
}

// session is the owner's view of rollout's latest session, once seeded.
func (w *world) session(rollout string) lending.SessionInfo {
	w.t.Helper()
	var c owner.Cookies
	testkit.Eventually(w.t, "the seed of "+rollout, func() (bool, string) {
		cs := w.owner.seeds(rollout)
		if len(cs) == 0 {
			return false, "not seeded"
		}
		c = cs[len(cs)-1]
		return true, ""
	})
	info, err := w.owner.Session(c)
	if err != nil {
		w.t.Fatal(err)
	}
	return info
}

// sessionDir waits for rollout's fake session in the sandbox and returns
// its host folder (the newest).
func (w *world) sessionDir(sandboxID, rollout string) string {
	w.t.Helper()
	var dir string
	testkit.Eventually(w.t, "a fake session of "+rollout, func() (bool, string) {
		m, _ := filepath.Glob(filepath.Join(w.hostFolder(sandboxID), local.RootFolder, "state", "fake", "*-a*-*"))
		var mine []string
		for _, d := range m {
			if strings.Contains(filepath.Base(d), sanitize(rollout)) {
				mine = append(mine, d)
			}
		}
		if len(mine) == 0 {
			return false, "none"
		}
		sort.Strings(mine)
		dir = mine[len(mine)-1]
		return true, ""
	})
	return dir
}

// sanitize is how the fake adapter names a rollout in a folder name.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

func waitSteps(t testing.TB, dir string, n int) {
	t.Helper()
	testkit.Eventually(t, fmt.Sprintf("%d steps in %s", n, dir), func() (bool, string) {
		got := fake.Steps(dir)
		return len(got) >= n, fmt.Sprintf("steps %v", got)
	})
}

// checkStepsOnce fails unless the session holds steps 1..n, each once.
func checkStepsOnce(t testing.TB, dir string, n int) {
	t.Helper()
	got := fake.Steps(dir)
	want := make([]int, n)
	for i := range want {
		want[i] = i + 1
	}
	if !slices.Equal(got, want) {
		t.Errorf("steps in %s: got %v, want each of 1..%d exactly once", dir, got, n)
	}
}

// harnesses counts the harness processes a session's pids file recorded
// (one per launch).
func harnesses(dir string) int {
	data, _ := os.ReadFile(filepath.Join(dir, "pids"))
	return strings.Count(string(data), "harness ")
}

// sandboxes lists the host folders of every sandbox of the world.
func (w *world) sandboxes() []string {
	ents, _ := os.ReadDir(filepath.Join(w.store, "sandboxes"))
	var out []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, filepath.Join(w.store, "sandboxes", e.Name()))
		}
	}
	return out
}

// procs lists the processes running in the world's sandboxes.
func (w *world) procs() []int {
	var out []int
	for _, f := range w.sandboxes() {
		out = append(out, fakeexecd.ProcsIn(f, mountPoint)...)
	}
	return out
}

// checkNoProcs waits until no process runs in the given sandboxes' folders.
func (w *world) checkNoProcs(what string, ids ...string) {
	w.t.Helper()
	testkit.Eventually(w.t, what+": no process left", func() (bool, string) {
		var left []string
		for _, id := range ids {
			for _, p := range fakeexecd.ProcsIn(w.hostFolder(id), mountPoint) {
				left = append(left, proctest.Describe(p))
			}
		}
		return len(left) == 0, fmt.Sprintf("running: %v", left)
	})
}

// cleanup cancels the runs still going, runs `ngsup stop --id` on every
// launch folder of every sandbox (out of band, through a local backend on
// the fakes' folders, so a broken fake cannot hide anything), fails the
// test if any process is still running in a sandbox, and kills those.
func (w *world) cleanup() {
	t := w.t
	w.mu.Lock()
	handles := slices.Clone(w.handles)
	w.mu.Unlock()
	for _, h := range handles {
		h.cancel(errors.New("backends_e2e: the test ended"))
	}
	for _, h := range handles {
		select {
		case <-h.done:
		case <-time.After(Patience):
			t.Errorf("cleanup: run %s did not return after its cancellation", h.rollout)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), Patience)
	defer cancel()
	lb, err := local.New(w.store, local.Options{Isolation: local.IsolationNamespace, MountPoint: mountPoint})
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	ng := w.newNgsup()
	for _, f := range w.sandboxes() {
		launches := filepath.Join(f, local.RootFolder, "launches")
		ents, err := os.ReadDir(launches)
		if err != nil {
			continue
		}
		sb, err := lb.Open(filepath.Base(f))
		if err != nil {
			continue
		}
		if _, err := ng.Ensure(ctx, sb); err != nil {
			t.Errorf("cleanup: %v", err)
			continue
		}
		for _, e := range ents {
			if proto.ValidateID(e.Name()) != nil {
				continue
			}
			ref := launch.Ref{ID: e.Name(), Dir: path.Join(sb.Root(), "launches", e.Name()), SandboxID: sb.ID()}
			if _, err := ng.Launcher(false).Stop(ctx, sb, ref, time.Second); err != nil {
				t.Errorf("cleanup: stop %s in %s: %v", e.Name(), f, err)
			}
		}
	}
	var left []string
	for range 3 {
		pids := w.procs()
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			left = append(left, proctest.Describe(p))
		}
		for _, f := range w.sandboxes() {
			fakeexecd.KillIn(f, mountPoint)
		}
	}
	if len(left) > 0 {
		t.Errorf("cleanup: processes were still running in the sandboxes after every launch was stopped (killed now): %v", left)
	}
	if t.Failed() {
		t.Logf("driver, owner and fake log:\n%s", w.buf.String())
	}
}

// recorder wraps the backend the runner uses: it counts the uploads of
// ngsup per sandbox.
type recorder struct {
	inner sandbox.Backend

	mu      sync.Mutex
	uploads map[string][]string // sandbox id -> paths uploaded
}

func (r *recorder) Name() string { return r.inner.Name() }

func (r *recorder) Connect(ctx context.Context, d sandbox.Descriptor) (sandbox.Sandbox, error) {
	sb, err := r.inner.Connect(ctx, d)
	if err != nil {
		return nil, err
	}
	return &recSandbox{Sandbox: sb, r: r}, nil
}

// ngsupUploads counts the uploads of ngsup into the sandbox.
func (r *recorder) ngsupUploads(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, p := range r.uploads[id] {
		if strings.HasPrefix(path.Base(p), "ngsup-") {
			n++
		}
	}
	return n
}

type recSandbox struct {
	sandbox.Sandbox
	r *recorder
}

func (s *recSandbox) Upload(ctx context.Context, p string, data []byte, mode uint32) error {
	err := s.Sandbox.Upload(ctx, p, data, mode)
	if err == nil {
		s.r.mu.Lock()
		s.r.uploads[s.ID()] = append(s.r.uploads[s.ID()], p)
		s.r.mu.Unlock()
	}
	return err
}

// trackingOwner is the owner, remembering each rollout's cookies.
type trackingOwner struct {
	*lending.Owner
	mu      sync.Mutex
	cookies map[string][]owner.Cookies
}

func (o *trackingOwner) SeedSession(ctx context.Context, key string, body json.RawMessage) (owner.SeedReply, error) {
	reply, err := o.Owner.SeedSession(ctx, key, body)
	if err == nil {
		var b struct {
			RolloutID string `json:"rollout_id"`
		}
		_ = json.Unmarshal(body, &b)
		o.mu.Lock()
		o.cookies[b.RolloutID] = append(o.cookies[b.RolloutID], reply.Cookies)
		o.mu.Unlock()
	}
	return reply, err
}

func (o *trackingOwner) seeds(rollout string) []owner.Cookies {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.cookies[rollout])
}

// newParticipant is a participant for the fake adapter.
func newParticipant() *driver.Participant {
	return driver.MustParticipant(driver.ParticipantConfig{Adapter: "fake"})
}

// controls are the checkpoint participants of one driver and the owner, in
// Gym's prepare order (agent, then resources).
func (w *world) controls(p *driver.Participant) []*gym.Control {
	return []*gym.Control{p.Control(), w.ownerControl()}
}

// checkpoint takes checkpoint id in process: prepare, commit into a
// folder of its own, resume after hold.
func (w *world) checkpoint(p *driver.Participant, id string, hold time.Duration) (driver.Committed, error) {
	return driver.Checkpoint(context.Background(), w.controls(p), filepath.Join(w.t.TempDir(), id), id, hold, w.log)
}

// restore restores c into the fresh participant p (and the owner).
func (w *world) restore(p *driver.Participant, c driver.Committed) error {
	return driver.Restore(context.Background(), w.controls(p), c)
}

// ownerControl is the owner's control plane (kind resources), made once
// per world: the owner outlives the drivers a test crashes.
func (w *world) ownerControl() *gym.Control {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ownerCtl == nil {
		c, err := owner.NewControl(w.owner.Owner, gym.Config{Instance: "ngdriver_owner", LeaseGrace: time.Minute})
		if err != nil {
			w.t.Fatal(err)
		}
		w.ownerCtl = c
	}
	return w.ownerCtl
}
