// Package memsandbox is a sandbox backend whose exec answers from memory:
// no process runs. It exists to measure the driver's own cost (CPU and
// memory per rollout) with every other cost taken away, at rollout counts
// this machine could never hold as real processes (test/soak -backend
// memory). It is for tests and benchmarks only; no shipped code imports
// it.
//
// It speaks the backend contract (pkg/driver/sandbox): Exec with the error
// classes of a backend (an empty argv or a bad environment key is an
// error, a cancelled context is the context's error, a removed sandbox is
// ErrGone), Upload, Root and Workdir, and the Lender side an owner uses.
// It answers the commands the driver, the fake adapter and the owner send,
// and nothing else (an unknown command exits 127 and is counted, Stats):
//
//   - uname -m, test -x|-e|-f PATH, cat [--] FILE, tail -c N [--] FILE,
//     ls -1 DIR, sh -c true (the soak's check);
//   - ngsup's verbs on an uploaded ngsup (a file named ngsup-*): run
//     --detach, wait, status, pause, continue, stop, version, printing the
//     lines of pkg/proto with ngsup's exit codes, pause and continue with
//     several --dir as ngsup does.
//
// A launch of the fake adapter's harness (/bin/sh .../fake-harness.sh
// SESSION WORKDIR ...) is a timer: it takes FAKE_STEPS steps of
// FAKE_STEP_S seconds of unpaused time, continuing after the steps its
// session already holds, and its session's steps file and the workdir's
// progress file read as the steps done so far (computed when read, so a
// launch costs the same memory whatever its length). Any other command
// launched ends at once with exit code 0. Time spent paused does not
// count, as for a process held by SIGSTOP.
//
// Uploads keep the caller's bytes without copying them (the driver uploads
// one cached ngsup image to every sandbox); a caller must not change them
// afterwards.
package memsandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/proto"
)

// Name is the provider name of the memory backend's sandboxes.
const Name = "memory"

// Paths every memory sandbox has.
const (
	// RootDir is each sandbox's Root.
	RootDir = "/sandbox/.ngharness"
	// WorkDir is each sandbox's Workdir.
	WorkDir = "/sandbox/work"
)

// processes is how many processes a launch reports held by a pause (the
// fake harness's 7 under ngsup).
const processes = 7

// ErrNoSandbox: Open named a sandbox this service does not have.
var ErrNoSandbox = errors.New("no such memory sandbox")

// Options configure a Service.
type Options struct {
	// Adopt makes Connect of a sandbox id the service has never seen
	// create it empty: the side of a driver whose owner runs in another
	// process, with a Service of its own (the two do not share files).
	Adopt bool
}

// Stats counts what the service did, for the benchmark's report.
type Stats struct {
	Sandboxes int            `json:"sandboxes"`
	Running   int            `json:"running"`
	Paused    int            `json:"paused"`
	Ended     int            `json:"ended"`
	Execs     map[string]int `json:"execs"`
	Unknown   int            `json:"unknown"`
	// LastUnknown is the last command not understood.
	LastUnknown string `json:"last_unknown,omitempty"`
}

// Service holds memory sandboxes and their snapshots. It is a
// sandbox.Backend and a sandbox.Lender.
type Service struct {
	opt Options

	mu        sync.Mutex
	boxes     map[string]*Sandbox
	snapshots map[string]*Sandbox // a frozen copy

	pids    atomic.Int64
	execMu  sync.Mutex
	execs   map[string]int
	unknown int
	lastUnk string
}

// New returns an empty service.
func New(opt Options) *Service {
	s := &Service{opt: opt, boxes: map[string]*Sandbox{}, snapshots: map[string]*Sandbox{}, execs: map[string]int{}}
	s.pids.Store(1000)
	return s
}

// Name implements sandbox.Backend and sandbox.Lender.
func (s *Service) Name() string { return Name }

// Connect implements sandbox.Backend.
func (s *Service) Connect(ctx context.Context, d sandbox.Descriptor) (sandbox.Sandbox, error) {
	if d.Provider != "" && d.Provider != Name {
		return nil, fmt.Errorf("connect to %s: the descriptor names provider %q, not %q", d.SandboxID, d.Provider, Name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.boxes[d.SandboxID]; ok {
		return b, nil
	}
	if !s.opt.Adopt {
		return nil, fmt.Errorf("connect to %s: %w: %w", d.SandboxID, sandbox.ErrGone, ErrNoSandbox)
	}
	b := s.newBox(d.SandboxID)
	s.boxes[b.id] = b
	return b, nil
}

func (s *Service) newBox(id string) *Sandbox {
	return &Sandbox{svc: s, id: id, files: map[string]file{}, launches: map[string]*mlaunch{}, virtual: map[string]virtualFile{}}
}

// Create implements sandbox.Lender.
func (s *Service) Create(ctx context.Context, name string) (sandbox.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.boxes[name]; ok {
		return nil, fmt.Errorf("create memory sandbox %s: it exists", name)
	}
	b := s.newBox(name)
	s.boxes[name] = b
	return b, nil
}

// Open implements sandbox.Lender.
func (s *Service) Open(ctx context.Context, id string) (sandbox.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.boxes[id]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("open %s: %w: %w", id, sandbox.ErrGone, ErrNoSandbox)
}

// Snapshot implements sandbox.Lender: a copy of the sandbox's files, its
// launches' folders carried as copies (nothing of them runs in a fork).
func (s *Service) Snapshot(ctx context.Context, sandboxID, name string) (string, error) {
	s.mu.Lock()
	b, ok := s.boxes[sandboxID]
	s.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("snapshot %s: %w: %w", sandboxID, sandbox.ErrGone, ErrNoSandbox)
	}
	c := b.copyAs(name)
	s.mu.Lock()
	s.snapshots[name] = c
	s.mu.Unlock()
	return name, nil
}

// Fork implements sandbox.Lender.
func (s *Service) Fork(ctx context.Context, snapshotID, name string) (sandbox.Sandbox, error) {
	s.mu.Lock()
	snap, ok := s.snapshots[snapshotID]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("fork %s: %w: no such snapshot", snapshotID, sandbox.ErrNotFound)
	}
	b := snap.copyAs(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.boxes[name] = b
	return b, nil
}

// Remove implements sandbox.Lender.
func (s *Service) Remove(ctx context.Context, id string) error {
	s.mu.Lock()
	b := s.boxes[id]
	delete(s.boxes, id)
	s.mu.Unlock()
	if b != nil {
		b.mu.Lock()
		b.removed = true
		for _, l := range b.launches {
			l.end(time.Now(), 128+9)
		}
		b.mu.Unlock()
	}
	return nil
}

// RemoveSnapshot implements sandbox.Lender.
func (s *Service) RemoveSnapshot(ctx context.Context, id string) error {
	s.mu.Lock()
	delete(s.snapshots, id)
	s.mu.Unlock()
	return nil
}

// FinishAll makes every running or paused launch of the fake harness
// finish now, with the steps it has done, as if its last step had just
// been taken (exit code 0): a benchmark ends its rollouts this way once it
// has measured them. It returns how many it finished.
func (s *Service) FinishAll() int {
	s.mu.Lock()
	boxes := make([]*Sandbox, 0, len(s.boxes))
	for _, b := range s.boxes {
		boxes = append(boxes, b)
	}
	s.mu.Unlock()
	n := 0
	now := time.Now()
	for _, b := range boxes {
		b.mu.Lock()
		for _, l := range b.launches {
			l.advance(now)
			if l.ended || l.copied || !l.fake {
				continue
			}
			l.steps = max(l.done, l.firstStep)
			l.done = l.steps
			l.end(now, 0)
			n++
		}
		b.mu.Unlock()
	}
	return n
}

// Stats returns the service's counts now.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	boxes := make([]*Sandbox, 0, len(s.boxes))
	for _, b := range s.boxes {
		boxes = append(boxes, b)
	}
	s.mu.Unlock()
	st := Stats{Sandboxes: len(boxes), Execs: map[string]int{}}
	now := time.Now()
	for _, b := range boxes {
		b.mu.Lock()
		for _, l := range b.launches {
			l.advance(now)
			switch {
			case l.ended:
				st.Ended++
			case l.paused:
				st.Paused++
			default:
				st.Running++
			}
		}
		b.mu.Unlock()
	}
	s.execMu.Lock()
	for k, v := range s.execs {
		st.Execs[k] = v
	}
	st.Unknown, st.LastUnknown = s.unknown, s.lastUnk
	s.execMu.Unlock()
	return st
}

func (s *Service) count(what string) {
	s.execMu.Lock()
	s.execs[what]++
	s.execMu.Unlock()
}

func (s *Service) countUnknown(argv []string) {
	s.execMu.Lock()
	s.unknown++
	s.lastUnk = strings.Join(argv, " ")
	if len(s.lastUnk) > 200 {
		s.lastUnk = s.lastUnk[:200]
	}
	s.execMu.Unlock()
}

// file is one uploaded file: the caller's bytes, not copied.
type file struct {
	data []byte
	mode uint32
}

// virtualFile is a file whose content a launch computes when read: the
// session's steps file or the workdir's progress file, a line per step
// done.
type virtualFile struct {
	l *mlaunch
}

// Sandbox is one memory sandbox.
type Sandbox struct {
	svc *Service
	id  string

	mu       sync.Mutex
	removed  bool
	files    map[string]file
	launches map[string]*mlaunch // by launch folder
	virtual  map[string]virtualFile
}

// ID implements sandbox.Sandbox.
func (b *Sandbox) ID() string { return b.id }

// Root implements sandbox.Sandbox.
func (b *Sandbox) Root() string { return RootDir }

// Workdir implements sandbox.Sandbox.
func (b *Sandbox) Workdir() string { return WorkDir }

// Upload implements sandbox.Sandbox: data is kept, not copied.
func (b *Sandbox) Upload(ctx context.Context, p string, data []byte, mode uint32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !path.IsAbs(p) {
		return fmt.Errorf("upload to %s in %s: the path is not absolute", p, b.id)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.removed {
		return fmt.Errorf("upload to %s: %w", b.id, sandbox.ErrGone)
	}
	b.files[path.Clean(p)] = file{data: data, mode: mode}
	return nil
}

// copyAs is a copy of b called name: files shared (they are never changed
// in place), virtual files made real, launches carried as copies.
func (b *Sandbox) copyAs(name string) *Sandbox {
	c := b.svc.newBox(name)
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for p, f := range b.files {
		c.files[p] = f
	}
	for p := range b.virtual {
		c.files[p] = file{data: b.read(p, now), mode: 0o644}
	}
	for d, l := range b.launches {
		l.advance(now)
		cp := *l
		cp.copied, cp.changed = true, make(chan struct{})
		c.launches[d] = &cp
	}
	return c
}

// result is a command's answer.
func result(code int, stdout, stderr string) sandbox.ExecResult {
	return sandbox.ExecResult{ExitCode: code, Stdout: []byte(stdout), Stderr: []byte(stderr)}
}

// Exec implements sandbox.Sandbox.
func (b *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	begin := time.Now()
	if len(req.Argv) == 0 {
		return sandbox.ExecResult{}, fmt.Errorf("exec in %s: an empty argv", b.id)
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "= \t\n\x00") {
			return sandbox.ExecResult{}, fmt.Errorf("exec in %s: the environment key %q is not a name", b.id, k)
		}
	}
	if err := ctx.Err(); err != nil {
		return sandbox.ExecResult{}, err
	}
	b.mu.Lock()
	gone := b.removed
	b.mu.Unlock()
	if gone {
		return sandbox.ExecResult{}, fmt.Errorf("exec in %s: %w", b.id, sandbox.ErrGone)
	}
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	res, err := b.exec(ctx, req)
	res.Duration = time.Since(begin)
	return res, err
}

func (b *Sandbox) exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	argv := req.Argv
	if strings.HasPrefix(path.Base(argv[0]), "ngsup-") {
		b.mu.Lock()
		_, ok := b.files[path.Clean(argv[0])]
		b.mu.Unlock()
		if !ok {
			return result(127, "", argv[0]+": not found\n"), nil
		}
		if len(argv) < 2 {
			return result(proto.ExitUsage, "", "ngsup: no verb\n"), nil
		}
		b.svc.count("ngsup " + argv[1])
		return b.ngsup(ctx, req, argv[1], argv[2:])
	}
	b.svc.count(argv[0])
	switch args := argv[1:]; argv[0] {
	case "uname":
		return result(0, "x86_64\n", ""), nil
	case "test":
		if len(args) == 2 {
			b.mu.Lock()
			defer b.mu.Unlock()
			p := path.Clean(args[1])
			f, isFile := b.files[p]
			_, isVirtual := b.virtual[p]
			ok := false
			switch args[0] {
			case "-x":
				ok = isFile && f.mode&0o111 != 0
			case "-e", "-f":
				ok = isFile || isVirtual
			}
			if ok {
				return result(0, "", ""), nil
			}
			return result(1, "", ""), nil
		}
	case "cat", "tail":
		n := -1
		if argv[0] == "tail" {
			if len(args) < 2 || args[0] != "-c" {
				break
			}
			var err error
			if n, err = strconv.Atoi(args[1]); err != nil || n < 0 {
				return result(1, "", "tail: invalid number of bytes\n"), nil
			}
			args = args[2:]
		}
		if len(args) > 0 && args[0] == "--" {
			args = args[1:]
		}
		if len(args) != 1 {
			break
		}
		b.mu.Lock()
		data, ok := b.readFile(path.Clean(args[0]), time.Now())
		b.mu.Unlock()
		if !ok {
			return result(1, "", argv[0]+": "+args[0]+": No such file or directory\n"), nil
		}
		if n >= 0 && len(data) > n {
			data = data[len(data)-n:]
		}
		return sandbox.ExecResult{Stdout: data}, nil
	case "ls":
		if len(args) == 2 && args[0] == "-1" {
			return b.ls(path.Clean(args[1])), nil
		}
	case "sh":
		if len(args) == 2 && args[0] == "-c" && strings.TrimSpace(args[1]) == "true" {
			return result(0, "", ""), nil
		}
	}
	b.svc.countUnknown(argv)
	return result(127, "", fmt.Sprintf("memory sandbox: cannot run %q\n", argv[0])), nil
}

// readFile reads a file, a virtual file or a launch's stdout or stderr
// (b.mu held).
func (b *Sandbox) readFile(p string, now time.Time) ([]byte, bool) {
	if f, ok := b.files[p]; ok {
		return f.data, true
	}
	if _, ok := b.virtual[p]; ok {
		return b.read(p, now), true
	}
	if l, ok := b.launches[path.Dir(p)]; ok {
		switch path.Base(p) {
		case proto.StdoutFile:
			l.advance(now)
			if l.ended && l.fake {
				return l.summary(), true
			}
			return nil, true
		case proto.StderrFile:
			return nil, true
		}
	}
	return nil, false
}

// read is a virtual file's content now (b.mu held).
func (b *Sandbox) read(p string, now time.Time) []byte {
	v := b.virtual[p]
	v.l.advance(now)
	var sb strings.Builder
	for i := 1; i <= v.l.done; i++ {
		sb.WriteString("step ")
		sb.WriteString(strconv.Itoa(i))
		sb.WriteByte('\n')
	}
	return []byte(sb.String())
}

// ls lists the names below dir, one a line, sorted.
func (b *Sandbox) ls(dir string) sandbox.ExecResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := map[string]bool{}
	add := func(p string) {
		if rest, ok := strings.CutPrefix(p, dir+"/"); ok && rest != "" {
			names[strings.SplitN(rest, "/", 2)[0]] = true
		}
	}
	for p := range b.files {
		add(p)
	}
	for p := range b.virtual {
		add(p)
	}
	for p := range b.launches {
		add(p)
	}
	if len(names) == 0 {
		return result(2, "", "ls: cannot access '"+dir+"': No such file or directory\n")
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return result(0, strings.Join(out, "\n")+"\n", "")
}

// mlaunch is one launch: the supervisor, its receipt, and the harness as a
// timer.
type mlaunch struct {
	receipt proto.Receipt
	// fake: the fake adapter's harness (a timer of steps); else the
	// command ends at once.
	fake      bool
	steps     int
	stepS     time.Duration
	firstStep int // the first step this launch takes (after the session's)
	done      int // the last step done
	task      string
	// started is when it started; pausedFor the time it spent paused
	// before pausedAt (the pause now, when paused).
	started   time.Time
	pausedFor time.Duration
	paused    bool
	pausedAt  time.Time
	ended     bool
	copied    bool          // a fork's copy of the folder: nothing of it runs here
	changed   chan struct{} // closed and replaced at a pause, continue or end
}

// advance brings the launch to now: steps done, and its end once the last
// step is done (b.mu held).
func (l *mlaunch) advance(now time.Time) {
	if l.ended || l.copied {
		return
	}
	if !l.fake {
		l.end(l.started, 0)
		return
	}
	ran := l.ranBy(now)
	n := l.firstStep - 1 + int(ran/l.stepS)
	if n > l.steps {
		n = l.steps
	}
	if n > l.done {
		l.done = n
	}
	if l.done >= l.steps {
		l.end(l.started.Add(l.pausedFor+time.Duration(l.steps-l.firstStep+1)*l.stepS), 0)
	}
}

// ranBy is the unpaused time the launch ran by now.
func (l *mlaunch) ranBy(now time.Time) time.Duration {
	end := now
	if l.paused {
		end = l.pausedAt
	}
	return end.Sub(l.started) - l.pausedFor
}

// endsIn is how much more unpaused time the launch needs (b.mu held).
func (l *mlaunch) endsIn(now time.Time) time.Duration {
	return time.Duration(l.steps-l.firstStep+1)*l.stepS - l.ranBy(now)
}

// end records the launch's end with code (b.mu held).
func (l *mlaunch) end(at time.Time, code int) {
	if l.ended {
		return
	}
	l.ended, l.paused = true, false
	l.receipt.Ended, l.receipt.EndedAt, l.receipt.ExitCode = true, at, code
	l.receipt.CleanupConfirmed = true
	if code > 128 {
		l.receipt.Signal = code - 128
	}
	l.wake()
}

func (l *mlaunch) wake() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// summary is the fake harness's last line of output.
func (l *mlaunch) summary() []byte {
	task := strings.NewReplacer(`"`, "", `\`, "", "\n", "").Replace(l.task)
	if len(task) > 200 {
		task = task[:200]
	}
	return fmt.Appendf(nil, "{\"text\":\"done after %d steps\",\"steps\":%d,\"first_step\":%d,\"task\":\"%s\"}\n", l.done, l.done, l.firstStep, task)
}

// flags reads a verb's flags: each --name value pair, --dir as often as
// given, and the words after "--".
type flags struct {
	dirs  []string
	vals  map[string]string
	bools map[string]bool
	rest  []string
}

func parseFlags(args []string, boolean ...string) (flags, error) {
	f := flags{vals: map[string]string{}, bools: map[string]bool{}}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			f.rest = args[i+1:]
			return f, nil
		case strings.HasPrefix(a, "--") && contains(boolean, a[2:]):
			f.bools[a[2:]] = true
		case strings.HasPrefix(a, "--") && i+1 < len(args):
			if a == "--dir" {
				f.dirs = append(f.dirs, args[i+1])
			} else {
				f.vals[a[2:]] = args[i+1]
			}
			i++
		default:
			return f, fmt.Errorf("unexpected argument %q", a)
		}
	}
	return f, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func line(v any) string {
	data, _ := json.Marshal(v)
	return string(data) + "\n"
}

func usage(err error) sandbox.ExecResult {
	return result(proto.ExitUsage, "", "ngsup: "+err.Error()+"\n")
}

// ngsup answers one verb of ngsup.
func (b *Sandbox) ngsup(ctx context.Context, req sandbox.ExecRequest, verb string, args []string) (sandbox.ExecResult, error) {
	f, err := parseFlags(args, "detach")
	if err != nil {
		return usage(err), nil
	}
	if verb == "version" {
		return result(0, line(proto.VersionResult{Version: "memory", GoVersion: "memory"}), ""), nil
	}
	if len(f.dirs) == 0 {
		return usage(fmt.Errorf("%w: --dir is required", proto.ErrBadDir)), nil
	}
	if len(f.dirs) > 1 && verb != "pause" && verb != "continue" {
		return usage(fmt.Errorf("%s takes one --dir", verb)), nil
	}
	dir, err := proto.ValidateDir(f.dirs[0])
	if err != nil {
		return usage(err), nil
	}
	switch verb {
	case "run":
		return b.run(req, dir, f), nil
	case "wait":
		return b.wait(ctx, dir, f)
	case "status":
		b.mu.Lock()
		defer b.mu.Unlock()
		l, ok := b.launches[dir]
		if !ok {
			return usage(fmt.Errorf("status %s: %w", dir, proto.ErrNoLaunch)), nil
		}
		l.advance(time.Now())
		return result(0, line(l.receipt), ""), nil
	case "pause", "continue":
		return b.pauseOrContinue(verb, f.dirs), nil
	case "stop":
		return b.stop(dir, f), nil
	}
	return usage(fmt.Errorf("unknown verb %q", verb)), nil
}

// run starts a launch (run --detach).
func (b *Sandbox) run(req sandbox.ExecRequest, dir string, f flags) sandbox.ExecResult {
	id := f.vals["id"]
	if err := proto.ValidateID(id); err != nil {
		return usage(err)
	}
	if !f.bools["detach"] || len(f.rest) == 0 {
		return usage(errors.New("the memory sandbox runs launches with --detach and a command only"))
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.launches[dir]; ok {
		return usage(fmt.Errorf("run in %s: %w", dir, proto.ErrLaunchExists))
	}
	pid := int(b.svc.pids.Add(2))
	l := &mlaunch{started: now, changed: make(chan struct{}), receipt: proto.Receipt{
		Version: proto.ReceiptVersion, ID: id, Command: f.rest, SupervisorPID: pid - 1, SupervisorStartTicks: uint64(pid),
		Started: true, HarnessPID: pid, HarnessPGID: pid, HarnessStartTicks: uint64(pid), StartedAt: now, ExitCode: -1,
	}}
	argv := f.rest
	if len(argv) >= 4 && path.Base(argv[1]) == "fake-harness.sh" {
		l.fake = true
		l.steps, _ = strconv.Atoi(req.Env["FAKE_STEPS"])
		if l.steps <= 0 {
			l.steps = 6
		}
		s, _ := strconv.ParseFloat(req.Env["FAKE_STEP_S"], 64)
		if s <= 0 {
			s = 0.5
		}
		l.stepS = time.Duration(s * float64(time.Second))
		l.task = strings.Join(argv[4:], " ")
		session, work := path.Clean(argv[2]), path.Clean(argv[3])
		stepsFile, progress := path.Join(session, "steps"), path.Join(work, "progress")
		// A relaunch continues after the steps its session holds.
		if data, ok := b.readFile(stepsFile, now); ok {
			l.done = strings.Count(string(data), "\n")
		}
		l.firstStep = l.done + 1
		delete(b.files, stepsFile)
		delete(b.files, progress)
		b.virtual[stepsFile] = virtualFile{l: l}
		b.virtual[progress] = virtualFile{l: l}
	}
	b.launches[dir] = l
	return result(0, line(proto.DetachResult{ID: id, PID: pid - 1, StartTicks: uint64(pid)}), "")
}

// wait blocks up to --timeout for the launch to end.
func (b *Sandbox) wait(ctx context.Context, dir string, f flags) (sandbox.ExecResult, error) {
	chunk := 30 * time.Second
	if v, ok := f.vals["timeout"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			return usage(fmt.Errorf("--timeout %q: %w", v, err)), nil
		}
		chunk = d
	}
	deadline := time.Now().Add(chunk)
	for {
		now := time.Now()
		b.mu.Lock()
		l, ok := b.launches[dir]
		if !ok {
			b.mu.Unlock()
			return usage(fmt.Errorf("wait %s: %w", dir, proto.ErrNoLaunch)), nil
		}
		l.advance(now)
		r, ended, changed := l.receipt, l.ended, l.changed
		var next time.Duration = -1
		if !ended && !l.paused && !l.copied && l.fake {
			next = l.endsIn(now)
		}
		b.mu.Unlock()
		if ended {
			return result(proto.ExitOK, line(r), ""), nil
		}
		left := deadline.Sub(now)
		if left <= 0 {
			return result(proto.ExitStillRunning, line(r), ""), nil
		}
		if next >= 0 && next < left {
			left = next
		}
		t := time.NewTimer(left)
		select {
		case <-t.C:
		case <-changed:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return sandbox.ExecResult{}, fmt.Errorf("ngsup wait in %s: %w", b.id, sandbox.ErrTimeout)
			}
			return sandbox.ExecResult{}, ctx.Err()
		}
	}
}

// pauseOrContinue pauses or continues the launches of dirs: one line of
// the verb's result (with several dirs, a PauseLine or ContinueLine each).
func (b *Sandbox) pauseOrContinue(verb string, dirs []string) sandbox.ExecResult {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out strings.Builder
	worst := 0
	for _, d := range dirs {
		code, v := b.pauseOne(verb, d, now)
		worst = max(worst, code)
		if len(dirs) == 1 {
			out.WriteString(line(v))
			continue
		}
		switch r := v.(type) {
		case proto.PauseResult:
			out.WriteString(line(proto.PauseLine{Dir: d, Code: code, PauseResult: r}))
		case proto.ContinueResult:
			out.WriteString(line(proto.ContinueLine{Dir: d, Code: code, ContinueResult: r}))
		}
	}
	return result(worst, out.String(), "")
}

// pauseOne pauses or continues one launch (b.mu held).
func (b *Sandbox) pauseOne(verb, dir string, now time.Time) (int, any) {
	l, ok := b.launches[path.Clean(dir)]
	if verb == "pause" {
		if !ok {
			return proto.ExitUsage, proto.PauseResult{Pending: []proto.Pending{}, Error: fmt.Sprintf("pause %s: %v", dir, proto.ErrNoLaunch)}
		}
		l.advance(now)
		if l.ended || l.copied {
			return proto.ExitEnded, proto.PauseResult{Ended: true, Pending: []proto.Pending{}, Method: proto.MethodNone}
		}
		if !l.paused {
			l.paused, l.pausedAt = true, now
			l.wake()
		}
		return proto.ExitOK, proto.PauseResult{Paused: true, Processes: processes, Passes: 2, Method: proto.MethodCgroupSignal,
			Supervised: true, Pending: []proto.Pending{}, ElapsedMS: float64(time.Since(now).Microseconds()) / 1000}
	}
	if !ok {
		return proto.ExitUsage, proto.ContinueResult{Pending: []proto.Pending{}}
	}
	l.advance(now)
	r := proto.ContinueResult{Method: proto.MethodCgroupSignal, Pending: []proto.Pending{}}
	if l.ended || l.copied {
		return proto.ExitOK, r
	}
	if l.paused {
		l.pausedFor += now.Sub(l.pausedAt)
		l.paused = false
		r.Continued = processes
		l.wake()
	}
	r.Found = processes
	return proto.ExitOK, r
}

// stop ends the launch of dir.
func (b *Sandbox) stop(dir string, f flags) sandbox.ExecResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	searched := []string{proto.SourceTree, proto.SourceGroup, proto.SourceCgroup, proto.SourceKnown, proto.SourceTag}
	l, ok := b.launches[dir]
	switch {
	case !ok:
		if f.vals["id"] == "" {
			return usage(fmt.Errorf("stop %s: %w", dir, proto.ErrNoLaunch))
		}
		// Tagged only, or nothing: found by the tag, none running.
		return result(0, line(proto.StopResult{Stopped: true, Method: proto.MethodScan, Survivors: []proto.Pending{},
			Searched: []string{proto.SourceKnown, proto.SourceTag}, Partial: true}), "")
	case l.copied:
		return result(0, line(proto.StopResult{Stopped: true, Method: proto.MethodNone, Survivors: []proto.Pending{}, Searched: []string{}, Copied: true}), "")
	}
	if id := f.vals["id"]; id != "" && id != l.receipt.ID {
		return usage(fmt.Errorf("stop %s: --id %s is not the launch's id %s", dir, id, l.receipt.ID))
	}
	now := time.Now()
	l.advance(now)
	r := proto.StopResult{Stopped: true, Method: proto.MethodCgroupSignal, Survivors: []proto.Pending{}, Searched: searched}
	if l.ended {
		r.Ended, r.Partial = true, true
		r.Searched = []string{proto.SourceCgroup, proto.SourceKnown, proto.SourceTag}
		return result(0, line(r), "")
	}
	r.Supervised, r.Interrupted = true, processes
	l.end(now, 128+2)
	return result(0, line(r), "")
}
