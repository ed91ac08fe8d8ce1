package local

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/pkg/reaper"
)

// The processes of a sandbox, found on this host without its launch
// folders. With namespace isolation every command of a sandbox runs in a
// mount namespace of its own in which the sandbox's folder is bind-mounted
// (at the mount point of the backend that ran it), and everything it starts
// stays in that namespace. The kernel's record of that mount
// (/proc/PID/mountinfo: the device and the path of the folder within its
// filesystem, "//deleted" appended once it is deleted) names the sandbox
// even after its folder was renamed away or deleted, when nothing of it is
// left on disk to name it (no launch folder, no receipt), and it names
// exactly one base: a process bound to a folder of another base, or to
// anything else, never matches.

// endBudget bounds how long ending a sandbox's processes may take: SIGKILL
// to each, then scans until none is left.
const endBudget = 10 * time.Second

// hostProc is a live process running in one of the backend's sandboxes.
type hostProc struct {
	proto.Proc
	// folder is the name, under base/sandboxes, of the folder bound in the
	// process's namespace: a sandbox id, or .remove-<id>-<hex> while its
	// removal runs; deleted says the folder is gone from the disk.
	folder  string
	deleted bool
}

// sandboxID is the id of the sandbox the process runs in: its folder's
// name, or the one a removal renamed it from.
func (p hostProc) sandboxID() string {
	name := p.folder
	if rest, ok := strings.CutPrefix(name, ".remove-"); ok {
		if i := strings.LastIndexByte(rest, '-'); i > 0 {
			return rest[:i]
		}
	}
	return name
}

// fsPath is a folder as mountinfo names it: the device ("major:minor") and
// the path within that device's filesystem.
type fsPath struct {
	dev, path string
}

// mountEntry is one line of a mountinfo file.
type mountEntry struct {
	dev, root, point string
}

// parseMountinfo reads the lines of a mountinfo file: "ID PARENT
// MAJOR:MINOR ROOT POINT ...", ROOT and POINT escaped (\ooo).
func parseMountinfo(data []byte) []mountEntry {
	var out []mountEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		out = append(out, mountEntry{dev: f[2], root: unescapeMount(f[3]), point: unescapeMount(f[4])})
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (space, tab, newline,
// backslash).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// sandboxesPath is the backend's sandboxes folder as mountinfo names it in
// this process's namespace (the one the backend's commands are started
// from): the device and path of the mount holding it, the rest of the way
// appended.
func (b *Backend) sandboxesPath() (fsPath, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fsPath{}, fmt.Errorf("read this process's mounts: %w", err)
	}
	dir := b.sandboxesDir()
	var best *mountEntry
	entries := parseMountinfo(data)
	for i := range entries {
		e := &entries[i]
		if within(dir, e.point) && (best == nil || len(e.point) >= len(best.point)) {
			best = e
		}
	}
	if best == nil {
		return fsPath{}, fmt.Errorf("no mount holds %s", dir)
	}
	rest := strings.TrimPrefix(dir, best.point)
	return fsPath{dev: best.dev, path: path.Join(best.root, "/"+rest)}, nil
}

// sandboxFolder returns the name of the folder of the backend's sandboxes
// that a mountinfo file binds (the last one, as the newest mount wins), and
// whether it is deleted; ok is false when it binds none.
func sandboxFolder(data []byte, sandboxes fsPath) (name string, deleted, ok bool) {
	prefix := sandboxes.path + "/"
	for _, e := range parseMountinfo(data) {
		if e.dev != sandboxes.dev || !strings.HasPrefix(e.root, prefix) {
			continue
		}
		rest, gone := strings.CutSuffix(e.root[len(prefix):], "//deleted")
		if rest == "" || strings.Contains(rest, "/") {
			continue // the sandboxes folder itself, or something inside a sandbox
		}
		name, deleted, ok = rest, gone, true
	}
	return name, deleted, ok
}

// binding says which folder of the backend's sandboxes the mount
// namespace of a process binds, as that process sees it: its name, whether
// it is deleted, and ok false when it binds none. err is not nil when the
// process could not be asked (it went away, or is exiting and has let go of
// its root and mounts). Either way a process that sees none says nothing of
// the others of its namespace (hostProcs).
type binding func(pid int) (folder string, deleted, ok bool, err error)

// byMounts is the binding read from the namespace's mounts (mountinfo):
// any folder of this base's sandboxes, at any mount point, deleted or not.
// It reads the namespace's whole mount table.
func (b *Backend) byMounts() (binding, error) {
	sandboxes, err := b.sandboxesPath()
	if err != nil {
		return nil, err
	}
	return func(pid int) (string, bool, bool, error) {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
		if err != nil {
			return "", false, false, err
		}
		name, deleted, ok := sandboxFolder(data, sandboxes)
		return name, deleted, ok, nil
	}, nil
}

// byFolders is the binding of a set of folders, each held at the
// backend's mount point: a namespace binds one when what it shows at the
// mount point is that folder (the same device and inode), which costs one
// stat a namespace instead of reading its mount table. A folder that does
// not exist is left out. A command run with another mount point (a driver
// configured with another) is not found by it.
func (b *Backend) byFolders(folders []string) binding {
	type key struct{ dev, ino uint64 }
	want := map[key]string{}
	for _, f := range folders {
		var st unix.Stat_t
		if unix.Stat(f, &st) == nil {
			want[key{st.Dev, st.Ino}] = filepath.Base(f)
		}
	}
	return func(pid int) (string, bool, bool, error) {
		if len(want) == 0 {
			return "", false, false, nil
		}
		var st unix.Stat_t
		if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/root"+b.mountPoint, &st); err != nil {
			return "", false, false, err
		}
		name, ok := want[key{st.Dev, st.Ino}]
		return name, false, ok, nil
	}
}

// hostProcs lists the live processes on this host that run in a mount
// namespace bound (see binding) to a folder of the backend's sandboxes. It
// reads each process's namespace link and groups the processes by it;
// processes of this process's own namespace (the host's) are none of a
// sandbox's. A namespace is asked of its processes in turn until one
// answers that it binds a folder: one process's "none" is not its
// namespace's, as a process that changed its root (chroot) or is exiting
// sees less of its namespace than the rest. Once one binds a folder, every
// process of the namespace runs in that sandbox, those asked before it
// too.
func (b *Backend) hostProcs(bound binding) ([]hostProc, error) {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("read this process's mount namespace: %w", err)
	}
	pids, err := reaper.ProcFS.PIDs()
	if err != nil {
		return nil, fmt.Errorf("list the processes: %w", err)
	}
	type namespace struct {
		pids    []int
		found   bool // a process of it binds folder
		folder  string
		deleted bool
	}
	namespaces := map[string]*namespace{}
	var order []*namespace
	for _, pid := range pids {
		link, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/mnt")
		if err != nil || link == self {
			continue // gone, a zombie, or the host's namespace
		}
		ns := namespaces[link]
		if ns == nil {
			ns = &namespace{}
			namespaces[link] = ns
			order = append(order, ns)
		}
		ns.pids = append(ns.pids, pid)
		if ns.found {
			continue
		}
		if folder, deleted, ok, err := bound(pid); err == nil && ok {
			ns.found, ns.folder, ns.deleted = true, folder, deleted
		}
	}
	var out []hostProc
	for _, ns := range order {
		if !ns.found {
			continue
		}
		for _, pid := range ns.pids {
			st, err := reaper.ProcFS.ReadStat(pid)
			if err != nil || st.State == 'Z' || st.State == 'X' {
				continue
			}
			out = append(out, hostProc{Proc: proto.Proc{PID: pid, StartTicks: st.StartTicks}, folder: ns.folder, deleted: ns.deleted})
		}
	}
	return out, nil
}

// endProcs SIGKILLs every live process bound to a folder of the backend's
// sandboxes that match accepts (by pid and start time, through a pidfd),
// and scans again until none is left or endBudget (or ctx) runs out. It
// returns how many it killed; ErrProcessesLeft names those still alive at
// the end.
func (b *Backend) endProcs(ctx context.Context, bound binding, match func(hostProc) bool) (int, error) {
	deadline := time.Now().Add(endBudget)
	killed := map[proto.Proc]bool{}
	for {
		procs, err := b.hostProcs(bound)
		if err != nil {
			return len(killed), err
		}
		var left []hostProc
		for _, p := range procs {
			if match(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			// A killed process may still be on its way out (a large one
			// takes a while to let go of its memory) once it no longer
			// shows as a sandbox's: ended means exited.
			var exiting []string
			for p := range killed {
				if reaper.ProcFS.Live(p) {
					exiting = append(exiting, strconv.Itoa(p.PID))
				}
			}
			if len(exiting) == 0 {
				return len(killed), nil
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				sort.Strings(exiting)
				return len(killed), fmt.Errorf("%w: killed, still exiting: %s", ErrProcessesLeft, strings.Join(exiting[:min(len(exiting), 8)], ", "))
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			sort.Slice(left, func(i, j int) bool { return left[i].PID < left[j].PID })
			var names []string
			for i, p := range left {
				if i == 8 {
					names = append(names, fmt.Sprintf("and %d more", len(left)-i))
					break
				}
				names = append(names, fmt.Sprintf("%d (sandbox %s)", p.PID, p.sandboxID()))
			}
			return len(killed), fmt.Errorf("%w: %s", ErrProcessesLeft, strings.Join(names, ", "))
		}
		for _, p := range left {
			if err := reaper.ProcFS.Signal(p.Proc, unix.SIGKILL); err == nil {
				killed[p.Proc] = true
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// EndSandboxes ends (SIGKILL) every process running in the sandboxes ids,
// found by the mount namespace it runs in (the sandbox's folder at the
// mount point), in one scan of the host's processes for all of them. It is
// how an owner ends the sandboxes a restore replaces: what runs there
// belongs to a run that crashed, launch or not, and no launch folder has to
// be read (a launch that is ended this way keeps a receipt that says it
// runs; its sandbox is abandoned). A sandbox that does not exist has no
// process left. Without namespace isolation it finds none (see EndStrays).
// It returns how many it killed; an error wrapping ErrProcessesLeft when
// some outlived endBudget.
func (b *Backend) EndSandboxes(ctx context.Context, ids []string) (int, error) {
	folders := make([]string, 0, len(ids))
	for _, id := range ids {
		if err := CheckID("sandbox", id); err != nil {
			return 0, err
		}
		folders = append(folders, b.HostPath(id))
	}
	if b.mountPoint == "" || len(folders) == 0 {
		return 0, nil
	}
	n, err := b.endProcs(ctx, b.byFolders(folders), func(hostProc) bool { return true })
	if err != nil {
		return n, fmt.Errorf("local: end the processes of sandboxes %s: %w", strings.Join(ids, ", "), err)
	}
	return n, nil
}

// EndStrays ends (SIGKILL) every process running in one of the backend's
// sandboxes that keep does not accept (keep nil: every sandbox), found by
// the mount namespace it runs in: those of a sandbox whose folder is still
// there, is being removed, or was deleted while they ran (such a sandbox
// is never kept). It is what a restarted owner runs before it serves: no
// session of its own uses any sandbox yet, and a deployment that died left
// its launches running, paused, or with their folders deleted. Without
// namespace isolation it finds none. It returns how many it killed.
func (b *Backend) EndStrays(ctx context.Context, keep func(id string) bool) (int, error) {
	bound, err := b.byMounts()
	if err != nil {
		return 0, fmt.Errorf("local: end the processes of sandboxes no session uses: %w", err)
	}
	n, err := b.endProcs(ctx, bound, func(p hostProc) bool {
		return p.deleted || strings.HasPrefix(p.folder, ".") || keep == nil || !keep(p.sandboxID())
	})
	if err != nil {
		return n, fmt.Errorf("local: end the processes of sandboxes no session uses: %w", err)
	}
	return n, nil
}
