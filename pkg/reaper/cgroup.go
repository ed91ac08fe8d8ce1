package reaper

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup is the launch's own cgroup, made where the sandbox lets ngsup make
// one. A freeze of it contains even a fork storm, which signals alone cannot;
// frozen tasks show S (v2) or D (v1), never T, so a freeze is confirmed by the
// cgroup's own state, not by the tasks' states.
type Cgroup struct {
	// Path is the cgroup's folder.
	Path string
	// Version is 2 (cgroup.freeze) or 1 (the v1 freezer).
	Version int
	// parent is the supervisor's own v1 freezer cgroup, where it returns
	// after forking the harness into Path.
	parent string
}

type mount struct {
	root, point, fstype, super string
}

func readMounts() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 3 {
			continue
		}
		out = append(out, mount{root: a[3], point: a[4], fstype: b[0], super: b[2]})
	}
	return out, sc.Err()
}

// selfCgroups maps a hierarchy ("" for v2, else the controller list) to this
// process's path in it.
func selfCgroups() (map[string]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

func under(m mount, self string) string {
	rel := self
	if m.root != "/" && strings.HasPrefix(self, m.root) {
		rel = strings.TrimPrefix(self, m.root)
	}
	return filepath.Join(m.point, rel)
}

// cgroupName is the name of the cgroup the supervisor (pid) makes for the
// launch id.
func cgroupName(id string, pid int) string {
	return "ngsup-" + id + "-" + strconv.Itoa(pid)
}

// CreateCgroup makes a cgroup named name beside nothing else of the sandbox:
// a child of this process's own cgroup, on the v2 hierarchy if one is mounted
// and writable, else under the v1 freezer. It returns ErrNoCgroup (wrapped)
// when neither can be made; the caller then relies on signals alone.
func CreateCgroup(name string) (*Cgroup, error) {
	mounts, err := readMounts()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCgroup, err)
	}
	self, err := selfCgroups()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCgroup, err)
	}
	var errs []error
	for _, m := range mounts {
		if m.fstype != "cgroup2" {
			continue
		}
		p, ok := self[""]
		if !ok {
			continue
		}
		dir := filepath.Join(under(m, p), name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "cgroup.freeze")); err != nil {
			os.Remove(dir)
			errs = append(errs, err)
			continue
		}
		return &Cgroup{Path: dir, Version: 2}, nil
	}
	for _, m := range mounts {
		if m.fstype != "cgroup" || !hasOption(m.super, "freezer") {
			continue
		}
		p, ok := self["freezer"]
		if !ok {
			continue
		}
		parent := under(m, p)
		dir := filepath.Join(parent, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		return &Cgroup{Path: dir, Version: 1, parent: parent}, nil
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("%w: no cgroup2 or freezer mount", ErrNoCgroup)
	}
	return nil, fmt.Errorf("%w: %v", ErrNoCgroup, errors.Join(errs...))
}

func hasOption(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// OpenCgroup returns the cgroup a receipt names, or nil when it names none or
// it no longer exists.
func OpenCgroup(path string, version int) *Cgroup {
	if path == "" || (version != 1 && version != 2) {
		return nil
	}
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	return &Cgroup{Path: path, Version: version}
}

func (c *Cgroup) write(file, value string) error {
	err := os.WriteFile(filepath.Join(c.Path, file), []byte(value), 0)
	if err != nil {
		return fmt.Errorf("write %s to cgroup %s: %w", strings.TrimSpace(value), file, err)
	}
	return nil
}

// AddSelf moves the calling process into c (v1: so the harness forked next
// is born inside it) and returns a function that moves it back out.
func (c *Cgroup) AddSelf() (restore func() error, err error) {
	if err := c.write("cgroup.procs", strconv.Itoa(os.Getpid())); err != nil {
		return nil, err
	}
	return func() error {
		if c.parent == "" {
			return nil
		}
		err := os.WriteFile(filepath.Join(c.parent, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
		if err != nil {
			return fmt.Errorf("leave cgroup %s: %w", c.Path, err)
		}
		return nil
	}, nil
}

// Procs lists the pids in the cgroup.
func (c *Cgroup) Procs() ([]int, error) {
	data, err := os.ReadFile(filepath.Join(c.Path, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range bytes.Fields(data) {
		if v, err := strconv.Atoi(string(f)); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// Frozen reports whether the cgroup is frozen right now (v2: cgroup.events
// says frozen 1; v1: freezer.state says FROZEN).
func (c *Cgroup) Frozen() (bool, error) {
	if c.Version == 2 {
		data, err := os.ReadFile(filepath.Join(c.Path, "cgroup.events"))
		if err != nil {
			return false, err
		}
		return bytes.Contains(data, []byte("frozen 1")), nil
	}
	data, err := os.ReadFile(filepath.Join(c.Path, "freezer.state"))
	if err != nil {
		return false, err
	}
	return string(bytes.TrimSpace(data)) == "FROZEN", nil
}

// FreezeAsked reports whether a freeze of the cgroup was asked for and not
// undone (v2: cgroup.freeze holds 1; v1: freezer.state is FROZEN or
// FREEZING), whether or not the kernel has finished it.
func (c *Cgroup) FreezeAsked() bool {
	file := "freezer.state"
	if c.Version == 2 {
		file = "cgroup.freeze"
	}
	data, err := os.ReadFile(filepath.Join(c.Path, file))
	if err != nil {
		return false
	}
	v := string(bytes.TrimSpace(data))
	return v == "1" || v == "FROZEN" || v == "FREEZING"
}

// Freeze freezes the cgroup and confirms it before deadline. If the freeze
// cannot be confirmed it thaws the cgroup back and returns an error, so a
// failed freeze never leaves a half-frozen launch.
func (c *Cgroup) Freeze(deadline time.Time) error {
	file, value := "cgroup.freeze", "1"
	if c.Version == 1 {
		file, value = "freezer.state", "FROZEN"
	}
	if err := c.write(file, value); err != nil {
		return err
	}
	wait := 50 * time.Microsecond
	for try := 1; ; try++ {
		ok, err := c.Frozen()
		if err != nil {
			c.Thaw()
			return fmt.Errorf("confirm freeze of %s: %w", c.Path, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			c.Thaw()
			return fmt.Errorf("confirm freeze of %s: still freezing at the deadline", c.Path)
		}
		// v1 cannot always finish a freeze while tasks keep forking: ask again.
		if c.Version == 1 && try%20 == 0 {
			c.write(file, value)
		}
		time.Sleep(wait)
		wait = min(wait*2, 5*time.Millisecond)
	}
}

// Thaw unfreezes the cgroup.
func (c *Cgroup) Thaw() error {
	if c.Version == 2 {
		return c.write("cgroup.freeze", "0")
	}
	return c.write("freezer.state", "THAWED")
}

// Kill kills every process in the cgroup where the kernel offers cgroup.kill
// (v2, Linux 5.14+). It reports false when it could not.
func (c *Cgroup) Kill() bool {
	if c.Version != 2 {
		return false
	}
	return c.write("cgroup.kill", "1") == nil
}

// KillAll sends SIGKILL to every process in the cgroup at once: through
// cgroup.kill where the kernel offers it (v2, which also kills what is forked
// meanwhile), else by freezing the cgroup (so no member forks or exits while
// it is listed), sending SIGKILL to each member by pid, and thawing it (a
// frozen task dies once thawed). With a freeze that cannot be confirmed
// before deadline, the members listed are killed all the same.
func (c *Cgroup) KillAll(deadline time.Time) {
	if c.Kill() {
		return
	}
	err := c.Freeze(deadline)
	if pids, perr := c.Procs(); perr == nil {
		for _, pid := range pids {
			kill(pid, unix.SIGKILL)
		}
	}
	if err == nil {
		c.Thaw()
	}
}

// Remove deletes the cgroup if it is empty.
func (c *Cgroup) Remove() error {
	if err := unix.Rmdir(c.Path); err != nil && err != unix.ENOENT {
		return fmt.Errorf("remove cgroup %s: %w", c.Path, err)
	}
	return nil
}

// Release removes the cgroup once it is empty, and reports whether it is
// gone. rmdir fails (EBUSY) until the kernel has let go of every member, a
// moment after the last one was reaped, so Release tries again for up to d.
// While cgroup.procs still lists a process it gives up at once (a detached
// process lives on in it), unless dying says those listed were killed and
// are on their way out.
func (c *Cgroup) Release(d time.Duration, dying bool) bool {
	deadline := time.Now().Add(d)
	wait := time.Millisecond
	for {
		err := unix.Rmdir(c.Path)
		if err == nil || err == unix.ENOENT {
			return true
		}
		if err != unix.EBUSY || time.Now().After(deadline) {
			return false
		}
		if !dying {
			if pids, err := c.Procs(); err != nil || len(pids) > 0 {
				return false
			}
		}
		time.Sleep(wait)
		wait = min(wait*2, 20*time.Millisecond)
	}
}
