package drivertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/ngharness/ngharness/internal/dockertest"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/docker"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// hostView is how an Env looks into its sandboxes from this machine: their
// files, their processes (by host pid) and a connection for its cleanup.
type hostView interface {
	// folder is the host folder that is the sandbox's mount point (every
	// path the driver uses in it is below).
	folder(id string) string
	// sandboxes lists the ids of the Env's sandboxes.
	sandboxes() []string
	// procs lists the host pids of the live processes in the sandboxes
	// (every sandbox of the Env when none is given).
	procs(ids ...string) []int
	// hostPids maps the pids a process in the sandbox holding hostPath
	// wrote there (in the sandbox's pid namespace) to host pids; a pid
	// with no live process maps to 0.
	hostPids(hostPath string) func(pid int) int
	// open connects to the sandbox.
	open(ctx context.Context, id string) (sandbox.Sandbox, error)
}

// localView: the sandboxes are folders of the Env's local backend (the
// local backend itself, or a fake whose sandboxes are those folders), and
// their processes share this machine's pid namespace. With pods, a sandbox
// id NS/POD (the kubectl backend's) is the folder k8s-NS.POD, as the fake
// kubectl names it; an id without "/" is the folder's own name.
type localView struct {
	lb   *local.Backend
	pods bool
}

// local is the local sandbox id of the sandbox id.
func (v localView) local(id string) string {
	if ns, pod, ok := strings.Cut(id, "/"); ok && v.pods {
		return "k8s-" + ns + "." + pod
	}
	return id
}

func (v localView) folder(id string) string { return v.lb.HostPath(v.local(id)) }

func (v localView) sandboxes() []string {
	ents, _ := os.ReadDir(filepath.Join(v.lb.Base(), "sandboxes"))
	var out []string
	for _, en := range ents {
		if en.IsDir() && !strings.HasPrefix(en.Name(), ".") {
			out = append(out, en.Name())
		}
	}
	return out
}

// procs finds a sandbox's processes by the bind mount of its folder at the
// mount point in their mountinfo.
func (v localView) procs(ids ...string) []int {
	var roots []string
	for _, id := range ids {
		roots = append(roots, v.folder(id))
	}
	all := filepath.Join(v.lb.Base(), "sandboxes") + "/"
	var out []int
	for _, pid := range proctest.Pids() {
		st, ok := proctest.ReadStat(pid)
		if !ok || !st.Live() {
			continue
		}
		for _, r := range proctest.MountRoots(pid, v.lb.MountPoint()) {
			if len(roots) == 0 && strings.HasPrefix(r, all) || slices.Contains(roots, r) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

func (v localView) hostPids(string) func(int) int { return func(pid int) int { return pid } }

func (v localView) open(_ context.Context, id string) (sandbox.Sandbox, error) {
	return v.lb.Open(v.local(id))
}

// remoteView: the sandboxes are a remote server's (a real OpenSandbox):
// nothing of them is seen from this machine, but through the backend. A
// sandbox of the Env's local backend (Env.OwnSandbox) is seen as localView
// sees it.
type remoteView struct {
	b     *opensandbox.Backend
	local localView
}

// isLocal reports whether id is a sandbox of the Env's local backend.
func (v remoteView) isLocal(id string) bool {
	_, err := os.Stat(v.local.folder(id))
	return err == nil
}

func (v remoteView) folder(id string) string {
	if v.isLocal(id) {
		return v.local.folder(id)
	}
	// A folder that does not exist, named for messages.
	return filepath.Join("/nonexistent-remote", id)
}

func (v remoteView) sandboxes() []string { return v.local.sandboxes() }

func (v remoteView) procs(ids ...string) []int {
	if len(ids) == 0 {
		return v.local.procs()
	}
	var local []string
	for _, id := range ids {
		if v.isLocal(id) {
			local = append(local, id)
		}
	}
	if len(local) == 0 {
		return nil
	}
	return v.local.procs(local...)
}

func (v remoteView) hostPids(hostPath string) func(int) int {
	if strings.HasPrefix(hostPath, v.local.lb.Base()+"/") {
		return v.local.hostPids(hostPath)
	}
	return func(int) int { return 0 }
}

func (v remoteView) open(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if v.isLocal(id) {
		return v.local.open(ctx, id)
	}
	return v.b.Open(ctx, id)
}

// dockerView: the sandboxes are containers of a real engine. Their files
// are below the container's merged folder (overlay2) on the host; their
// processes are those of the container's pid namespace but its first (the
// one that keeps it running), whose own pids the host reads in NSpid. A
// sandbox of the Env's local backend (Env.OwnSandbox) is seen as localView
// sees it.
type dockerView struct {
	eng        *dockertest.Engine
	b          *docker.Backend
	mountPoint string
	local      localView
}

// isLocal reports whether id is a sandbox of the Env's local backend.
func (v dockerView) isLocal(id string) bool {
	_, err := os.Stat(v.local.folder(id))
	return err == nil
}

func (v dockerView) folder(id string) string {
	if v.isLocal(id) {
		return v.local.folder(id)
	}
	c, err := v.eng.Inspect(id)
	if err != nil {
		// Gone: a folder that does not exist, named for messages.
		return filepath.Join("/nonexistent-container", id, v.mountPoint)
	}
	return c.MergedDir + v.mountPoint
}

func (v dockerView) sandboxes() []string {
	return append(v.eng.Containers(), v.local.sandboxes()...)
}

func (v dockerView) procs(ids ...string) []int {
	var out []int
	if len(ids) == 0 {
		ids = v.eng.Containers()
		out = v.local.procs()
	}
	for _, id := range ids {
		if v.isLocal(id) {
			out = append(out, v.local.procs(id)...)
			continue
		}
		c, err := v.eng.Inspect(id)
		if err != nil {
			continue
		}
		for _, host := range c.Procs() {
			out = append(out, host)
		}
	}
	slices.Sort(out)
	return out
}

func (v dockerView) hostPids(hostPath string) func(int) int {
	if strings.HasPrefix(hostPath, v.local.lb.Base()+"/") {
		return v.local.hostPids(hostPath)
	}
	if f, ok := v.pidMap(hostPath); ok {
		return f
	}
	return func(int) int { return 0 }
}

// pidMap is hostPids of the Env's container that holds hostPath; ok is
// false when none does.
func (v dockerView) pidMap(hostPath string) (func(int) int, bool) {
	if strings.HasPrefix(hostPath, v.local.lb.Base()+"/") {
		return v.local.hostPids(hostPath), true
	}
	for _, id := range v.eng.Containers() {
		c, err := v.eng.Inspect(id)
		if err == nil && strings.HasPrefix(hostPath, c.MergedDir+"/") {
			m := c.Procs()
			return func(pid int) int { return m[pid] }, true
		}
	}
	return nil, false
}

// The docker views of the live Envs, for ReadPids (which has no Env).
var (
	realMu    sync.Mutex
	realViews = map[*dockerView]bool{}
)

// pidsOf maps the pids a sandbox process wrote below hostPath to host
// pids: unchanged while no Env runs on a real engine; else through the
// container that holds hostPath (0, gone, when no live Env's does).
func pidsOf(hostPath string) func(int) int {
	realMu.Lock()
	var vs []*dockerView
	for v := range realViews {
		vs = append(vs, v)
	}
	realMu.Unlock()
	if len(vs) == 0 {
		return func(pid int) int { return pid }
	}
	for _, v := range vs {
		if f, ok := v.pidMap(hostPath); ok {
			return f
		}
	}
	return func(int) int { return 0 }
}

func (v dockerView) open(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if v.isLocal(id) {
		return v.local.open(ctx, id)
	}
	return v.b.Open(ctx, id)
}

// hostOf maps a path inside a sandbox whose folder is at mountPoint to its
// host path.
func hostOf(v hostView, id, mountPoint, inside string) (string, error) {
	c := filepath.Clean(inside)
	rel, ok := strings.CutPrefix(c, mountPoint+"/")
	if !filepath.IsAbs(inside) || !ok {
		return "", fmt.Errorf("sandbox %s: path %q is not below its mount point %s", id, inside, mountPoint)
	}
	return filepath.Join(v.folder(id), rel), nil
}
