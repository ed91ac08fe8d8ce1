// Package local is the embedded default sandbox backend: sandboxes on this
// machine, one folder per sandbox, snapshot and fork by copying the folder.
//
// Layout under the backend's base folder:
//
//	base/sandboxes/<id>/      a sandbox: work/ (the task's workdir), home/, .ngharness/ (ngharness's own files)
//	base/snapshots/<id>/      a snapshot: a copy of a sandbox folder
//	base/tools/<name>-<sum>   a helper binary shared by every sandbox, read-only to them (tools.go)
//
// A fork must look the same from inside as the sandbox it was taken from
// (a saved harness session names absolute paths), so with namespace
// isolation every command runs in a mount namespace of its own in which the
// sandbox's folder is bind-mounted at one fixed path, the mount point
// (default /sandbox). Processes a command leaves running keep that namespace.
// Without isolation the sandbox's paths are its host folder's paths.
//
// The namespace gives the sandbox its paths, not a security boundary:
// commands run as the driver's user and see the rest of the host.
package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Name is the backend's provider name.
const Name = "local"

// Isolation modes of Options.Isolation.
const (
	// IsolationAuto uses a mount namespace per exec when running as root and
	// unshare works, and no isolation otherwise.
	IsolationAuto = "auto"
	// IsolationNamespace requires a mount namespace per exec.
	IsolationNamespace = "namespace"
	// IsolationNone runs commands on the host: the sandbox's paths are its
	// host folder's paths.
	IsolationNone = "none"
)

// DefaultMountPoint is where a sandbox's folder appears inside it.
const DefaultMountPoint = "/sandbox"

// unsharePath is the unshare(1) the backend runs (found on PATH if absent).
const unsharePath = "/usr/bin/unshare"

// Folders inside every sandbox.
const (
	// WorkFolder is the task's working folder (Workdir).
	WorkFolder = "work"
	// HomeFolder is HOME.
	HomeFolder = "home"
	// RootFolder is where ngharness keeps its files (Root).
	RootFolder = ".ngharness"
)

// ErrBadID means a sandbox or snapshot id is not a plain name.
var ErrBadID = errors.New("bad id")

// ErrExists means a sandbox or snapshot with that id exists already.
var ErrExists = errors.New("already exists")

// ErrProcessesLeft means processes of a sandbox were still alive when
// ending them ran out of time; the sandbox is not removed.
var ErrProcessesLeft = errors.New("processes of the sandbox are still alive")

// ErrBaseInUse means another owner holds the base folder (Claim).
var ErrBaseInUse = errors.New("the base folder is in use by another owner")

// ErrToolSum means a shared tool's content does not hash to the sum given
// with it (SharedTool).
var ErrToolSum = errors.New("the tool's content does not match its sum")

// ErrToolUnknown means a command names a file of the tools folder that
// this backend did not install: it is run only once installed here.
var ErrToolUnknown = errors.New("not a tool this backend installed")

// maxIDLen bounds ids so that the temporary names built from them stay
// under the file name limit.
const maxIDLen = 160

// Options configure a Backend. The json tags are the keys of its section
// of ngdriver's config (backends.local, read by config.DecodeSection),
// beside base, the folder New takes.
type Options struct {
	// MountPoint is the fixed path at which every sandbox's folder appears
	// inside it (default "/sandbox"). Absolute, not "/", and neither inside
	// the base folder nor above it. Unused without namespace isolation.
	MountPoint string `json:"mount_point"`
	// Isolation: "auto" (default: a mount namespace per sandbox when running
	// as root and unshare works), "namespace" (required; error if
	// unavailable), "none" (no namespace: the sandbox's paths are its host
	// folder's paths).
	Isolation string `json:"isolation"`
	// Env is the base environment of every command: it is laid over the
	// defaults (PATH from the host, HOME=<mountpoint>/home, LANG=C.UTF-8),
	// an entry here replacing the default of the same name. The driver's own
	// environment is never passed on.
	Env map[string]string `json:"-"`
}

// Backend keeps sandboxes in folders under its base folder. Its methods
// are safe for concurrent use.
type Backend struct {
	base       string
	mountPoint string // "" without namespace isolation
	isolation  string // IsolationNamespace or IsolationNone
	unshare    string
	mount      string
	env        map[string]string // base environment; without HOME, each sandbox's home/ is added
	tools      toolStore         // the shared tools (tools.go)
}

// New makes a backend keeping sandboxes under base (base/sandboxes/<id>,
// base/snapshots/<id>, and the shared tools in base/tools). It creates
// those folders and, with namespace
// isolation, the mount point on the host (an empty folder that only the
// commands' namespaces mount over).
func New(base string, opt Options) (*Backend, error) {
	if base == "" || !filepath.IsAbs(base) {
		return nil, fmt.Errorf("local: base folder %q is not an absolute path", base)
	}
	base = filepath.Clean(base)
	b := &Backend{base: base}
	for _, d := range []string{b.sandboxesDir(), b.snapshotsDir(), b.toolsDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("local: create %s: %w", d, err)
		}
	}
	// Resolve symlinks in base, so that the bind mount's source and the
	// overlap check below see the real folder.
	if real, err := filepath.EvalSymlinks(base); err == nil {
		b.base = real
	}

	mp := opt.MountPoint
	if mp == "" {
		mp = DefaultMountPoint
	}
	if !filepath.IsAbs(mp) {
		return nil, fmt.Errorf("local: mount point %q is not an absolute path", mp)
	}
	mp = filepath.Clean(mp)

	iso := opt.Isolation
	if iso == "" {
		iso = IsolationAuto
	}
	switch iso {
	case IsolationAuto, IsolationNamespace:
		why := b.namespaceUnavailable(mp)
		switch {
		case why == nil:
			iso = IsolationNamespace
		case iso == IsolationNamespace:
			return nil, fmt.Errorf("local: namespace isolation unavailable: %w", why)
		default:
			iso = IsolationNone
		}
	case IsolationNone:
	default:
		return nil, fmt.Errorf("local: unknown isolation %q (want auto, namespace or none)", opt.Isolation)
	}
	b.isolation = iso
	if iso == IsolationNamespace {
		b.mountPoint = mp
	}

	if err := sandbox.CheckEnv(opt.Env); err != nil {
		return nil, fmt.Errorf("local: base environment: %w", err)
	}
	for k, v := range opt.Env {
		if strings.IndexByte(v, 0) >= 0 {
			return nil, fmt.Errorf("local: base environment: the value of %s holds a NUL byte", k)
		}
	}
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	b.env = map[string]string{"PATH": path, "LANG": "C.UTF-8"}
	if b.mountPoint != "" {
		b.env["HOME"] = filepath.Join(b.mountPoint, HomeFolder)
	}
	for k, v := range opt.Env {
		b.env[k] = v
	}
	return b, nil
}

// namespaceUnavailable says why a mount namespace per exec cannot be used
// (nil when it can): not root, no unshare or mount, the mount point cannot
// be made, or a trial bind mount in a throwaway namespace fails.
func (b *Backend) namespaceUnavailable(mp string) error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	if mp == "/" {
		return errors.New("the mount point cannot be /")
	}
	if within(mp, b.base) || within(b.base, mp) {
		return fmt.Errorf("the mount point %s and the base folder %s overlap", mp, b.base)
	}
	unshare := unsharePath
	if _, err := os.Stat(unshare); err != nil {
		p, lerr := exec.LookPath("unshare")
		if lerr != nil {
			return fmt.Errorf("no unshare: %w", lerr)
		}
		unshare = p
	}
	mount, err := exec.LookPath("mount")
	if err != nil {
		return fmt.Errorf("no mount: %w", err)
	}
	if err := os.MkdirAll(mp, 0o755); err != nil {
		return fmt.Errorf("create the mount point: %w", err)
	}
	// A bind mount of the base folder onto itself, in a namespace that dies
	// with the probe.
	out, err := exec.Command(unshare, "--mount", "--propagation", "private", "--",
		mount, "--bind", b.base, b.base).CombinedOutput()
	if err != nil {
		return fmt.Errorf("trial bind mount: %v: %s", err, strings.TrimSpace(string(out)))
	}
	b.unshare, b.mount = unshare, mount
	return nil
}

// within reports whether p is dir or below it (both clean and absolute).
func within(p, dir string) bool {
	if p == dir {
		return true
	}
	if dir == "/" {
		return true
	}
	return strings.HasPrefix(p, dir+"/")
}

// Name is the provider name descriptors use: "local".
func (b *Backend) Name() string { return Name }

// Isolation is the isolation in effect: "namespace" or "none".
func (b *Backend) Isolation() string { return b.isolation }

// MountPoint is where a sandbox's folder appears inside it; "" without
// namespace isolation (the sandbox's paths are then its host folder's).
func (b *Backend) MountPoint() string { return b.mountPoint }

// Base is the backend's base folder.
func (b *Backend) Base() string { return b.base }

func (b *Backend) sandboxesDir() string { return filepath.Join(b.base, "sandboxes") }
func (b *Backend) snapshotsDir() string { return filepath.Join(b.base, "snapshots") }

// HostPath is the sandbox's folder on this machine. The id is not checked:
// call it with ids the backend accepted.
func (b *Backend) HostPath(id string) string { return filepath.Join(b.sandboxesDir(), id) }

// SnapshotPath is the snapshot's folder on this machine.
func (b *Backend) SnapshotPath(id string) string { return filepath.Join(b.snapshotsDir(), id) }

// CheckID rejects an id that is not a plain name: empty, longer than 160
// bytes, starting with a dot, or holding anything but ASCII letters,
// digits, '.', '_' and '-'.
func CheckID(kind, id string) error {
	if id == "" {
		return fmt.Errorf("local: %w: empty %s id", ErrBadID, kind)
	}
	if len(id) > maxIDLen {
		return fmt.Errorf("local: %w: %s id %.40q... is longer than %d bytes", ErrBadID, kind, id, maxIDLen)
	}
	if id[0] == '.' {
		return fmt.Errorf("local: %w: %s id %q starts with a dot", ErrBadID, kind, id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("local: %w: %s id %q holds %q (allowed: letters, digits, '.', '_', '-')", ErrBadID, kind, id, r)
		}
	}
	return nil
}

// Create makes a new empty sandbox: its folder with work/ (the Workdir),
// home/ and .ngharness/ (the Root). An existing id is ErrExists.
func (b *Backend) Create(ctx context.Context, id string) (*Sandbox, error) {
	if err := CheckID("sandbox", id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(b.sandboxesDir(), ".new-"+id+"-")
	if err != nil {
		return nil, fmt.Errorf("local: create sandbox %s: %w", id, err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("local: create sandbox %s: %w", id, err)
	}
	for _, d := range []string{WorkFolder, HomeFolder, RootFolder} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return nil, fmt.Errorf("local: create sandbox %s: %w", id, err)
		}
	}
	if err := renameNoReplace(tmp, b.HostPath(id)); err != nil {
		return nil, fmt.Errorf("local: create sandbox %s: %w", id, err)
	}
	return b.open(id, ""), nil
}

// Connect returns the sandbox a descriptor names. Its provider must be
// "local" (or empty); a sandbox whose folder does not exist is ErrGone. A
// descriptor's workdir, when set, becomes the sandbox's Workdir.
func (b *Backend) Connect(ctx context.Context, d sandbox.Descriptor) (sandbox.Sandbox, error) {
	if d.Provider != "" && d.Provider != b.Name() {
		return nil, fmt.Errorf("local: the descriptor names provider %q, not %q", d.Provider, b.Name())
	}
	if err := CheckID("sandbox", d.SandboxID); err != nil {
		return nil, err
	}
	if d.Workdir != "" && !filepath.IsAbs(d.Workdir) {
		return nil, fmt.Errorf("local: the descriptor's workdir %q is not an absolute path", d.Workdir)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := b.exists(d.SandboxID); err != nil {
		return nil, err
	}
	return b.open(d.SandboxID, d.Workdir), nil
}

// Open returns the sandbox with that id (ErrGone when its folder does not
// exist).
func (b *Backend) Open(id string) (*Sandbox, error) {
	if err := CheckID("sandbox", id); err != nil {
		return nil, err
	}
	if err := b.exists(id); err != nil {
		return nil, err
	}
	return b.open(id, ""), nil
}

func (b *Backend) exists(id string) error {
	fi, err := os.Stat(b.HostPath(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("local: sandbox %s: %w (no folder %s)", id, sandbox.ErrGone, b.HostPath(id))
		}
		return fmt.Errorf("local: sandbox %s: %w", id, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("local: sandbox %s: %s is not a folder", id, b.HostPath(id))
	}
	return nil
}

func (b *Backend) open(id, workdir string) *Sandbox {
	s := &Sandbox{b: b, id: id, host: b.HostPath(id)}
	s.inside = s.host
	if b.mountPoint != "" {
		s.inside = b.mountPoint
	}
	s.workdir = filepath.Join(s.inside, WorkFolder)
	if workdir != "" {
		s.workdir = filepath.Clean(workdir)
	}
	return s
}

// Snapshot copies a sandbox's folder to the snapshot snapshotID (what cp -a
// --reflink=auto copies, in this process: copyFolder), atomically: the copy is made under a temporary name and
// renamed when complete. An existing snapshot is never replaced
// (ErrExists); a sandbox that does not exist is ErrGone. The caller keeps
// the sandbox still while it is copied.
func (b *Backend) Snapshot(ctx context.Context, sandboxID, snapshotID string) error {
	if err := CheckID("sandbox", sandboxID); err != nil {
		return err
	}
	if err := CheckID("snapshot", snapshotID); err != nil {
		return err
	}
	if err := b.exists(sandboxID); err != nil {
		return err
	}
	if err := b.copyTree(ctx, b.HostPath(sandboxID), b.snapshotsDir(), snapshotID); err != nil {
		return fmt.Errorf("local: snapshot %s of sandbox %s: %w", snapshotID, sandboxID, err)
	}
	return nil
}

// Fork makes a new sandbox newID from a snapshot: a copy of the snapshot's
// folder, so it has the same files at the same paths inside. A snapshot
// that does not exist is ErrNotFound; an existing newID is ErrExists.
func (b *Backend) Fork(ctx context.Context, snapshotID, newID string) (*Sandbox, error) {
	if err := CheckID("snapshot", snapshotID); err != nil {
		return nil, err
	}
	if err := CheckID("sandbox", newID); err != nil {
		return nil, err
	}
	if _, err := os.Stat(b.SnapshotPath(snapshotID)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("local: fork %s: snapshot %s: %w", newID, snapshotID, sandbox.ErrNotFound)
		}
		return nil, fmt.Errorf("local: fork %s: %w", newID, err)
	}
	if err := b.copyTree(ctx, b.SnapshotPath(snapshotID), b.sandboxesDir(), newID); err != nil {
		return nil, fmt.Errorf("local: fork %s from snapshot %s: %w", newID, snapshotID, err)
	}
	return b.open(newID, ""), nil
}

// Remove deletes a sandbox's folder, ending every process still running in
// it first. The folder is renamed away at once (no command can start in
// the sandbox from then on); then, with namespace isolation, every process
// whose mount namespace shows that folder at the mount point gets SIGKILL
// (the owner's StopSandbox is the graceful stop; this ends whatever it left
// or could not reach, launch or not); then the folder is deleted. When processes outlive that, the error wraps
// ErrProcessesLeft and the renamed folder is kept, so that nothing of a
// sandbox ever runs on with its folder gone. Removing a sandbox that does
// not exist is not an error.
func (b *Backend) Remove(ctx context.Context, id string) error {
	if err := CheckID("sandbox", id); err != nil {
		return err
	}
	gone, err := renameAway(b.sandboxesDir(), id)
	if err != nil {
		return fmt.Errorf("local: remove sandbox %s: %w", id, err)
	}
	if gone == "" {
		return nil
	}
	if b.mountPoint == "" {
		return removeAll(gone)
	}
	if _, err := b.endProcs(ctx, b.byFolders([]string{gone}), func(hostProc) bool { return true }); err != nil {
		return fmt.Errorf("local: remove sandbox %s: end its processes (its folder stays at %s): %w", id, gone, err)
	}
	if err := removeAll(gone); err != nil {
		return fmt.Errorf("local: remove sandbox %s: %w", id, err)
	}
	return nil
}

// RemoveSnapshot deletes a snapshot. Removing a snapshot that does not
// exist is not an error.
func (b *Backend) RemoveSnapshot(ctx context.Context, id string) error {
	if err := CheckID("snapshot", id); err != nil {
		return err
	}
	if err := removeTree(b.snapshotsDir(), id); err != nil {
		return fmt.Errorf("local: remove snapshot %s: %w", id, err)
	}
	return nil
}

// HasSnapshot reports whether the snapshot exists.
func (b *Backend) HasSnapshot(id string) bool {
	if CheckID("snapshot", id) != nil {
		return false
	}
	fi, err := os.Stat(b.SnapshotPath(id))
	return err == nil && fi.IsDir()
}

// List returns the ids of the sandboxes whose folders are under the base
// folder, sorted (not the temporary folders of a create, copy or removal in
// progress).
func (b *Backend) List() ([]string, error) {
	ents, err := os.ReadDir(b.sandboxesDir())
	if err != nil {
		return nil, fmt.Errorf("local: list the sandboxes: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && CheckID("sandbox", e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// ownerLockFile is the file under the base folder whose lock Claim takes.
const ownerLockFile = "owner.lock"

// Claim takes the base folder for one owner: an exclusive lock on
// base/owner.lock, held until release is called or the process ends (a
// killed owner leaves no lock behind). An owner that starts ends what the
// sandboxes of its base still run (EndStrays), which must never happen
// under a live owner of the same base: a second Claim of a held base fails
// with ErrBaseInUse, naming the pid the holder wrote.
func (b *Backend) Claim() (release func(), err error) {
	p := filepath.Join(b.base, ownerLockFile)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("local: claim the base folder %s: %w", b.base, &os.PathError{Op: "open", Path: p, Err: err})
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		buf := make([]byte, 32)
		n, _ := unix.Pread(fd, buf, 0)
		unix.Close(fd)
		holder := strings.TrimSpace(string(buf[:max(n, 0)]))
		if _, perr := strconv.Atoi(holder); perr != nil {
			holder = "unknown"
		}
		if err == unix.EWOULDBLOCK {
			return nil, fmt.Errorf("local: claim the base folder %s: %w (pid %s holds %s)", b.base, ErrBaseInUse, holder, p)
		}
		return nil, fmt.Errorf("local: claim the base folder %s: lock %s: %w", b.base, p, err)
	}
	if err := unix.Ftruncate(fd, 0); err == nil {
		unix.Pwrite(fd, []byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { unix.Close(fd) }, nil
}
