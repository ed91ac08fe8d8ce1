package drivertest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Stat is what a test reads of /proc/PID/stat.
type Stat struct {
	PID        int
	Comm       string
	State      byte
	PPID       int
	StartTicks uint64
}

// ReadStat reads /proc/PID/stat; ok is false when the process is gone.
func ReadStat(pid int) (Stat, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, false
	}
	open := bytes.IndexByte(data, '(')
	closing := bytes.LastIndexByte(data, ')')
	if open < 0 || closing < open {
		return Stat{}, false
	}
	f := strings.Fields(string(data[closing+1:]))
	// f[0] is field 3 (state); field 22 (starttime) is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return Stat{}, false
	}
	return Stat{PID: pid, Comm: string(data[open+1 : closing]), State: f[0][0], PPID: ppid, StartTicks: start}, true
}

// Proc is one process a fake harness recorded in its session's pids file,
// with the start time it had when the test read the file.
type Proc struct {
	Kind       string // harness, child, own_session, daemon, untagged
	PID        int
	StartTicks uint64 // 0 when it was already gone when read
}

func (p Proc) String() string { return fmt.Sprintf("%s %d", p.Kind, p.PID) }

// Alive reports whether the process is still the one that was read (same
// pid and start time) and not a zombie.
func (p Proc) Alive() bool {
	if p.StartTicks == 0 {
		return false
	}
	st, ok := ReadStat(p.PID)
	return ok && st.StartTicks == p.StartTicks && st.State != 'Z' && st.State != 'X'
}

// State is the process's state letter now ('-' when it is gone or its pid
// belongs to another process now).
func (p Proc) State() byte {
	st, ok := ReadStat(p.PID)
	if !ok || st.StartTicks != p.StartTicks {
		return '-'
	}
	return st.State
}

// ReadPids reads a fake harness's pids file (on the host) and the start
// time of each process in it. In a container of a real engine
// (DRIVERTEST_BACKEND=docker-real) the file's pids are the container's:
// each is read as the host pid of that process, and one whose process is
// gone reads as gone.
func ReadPids(hostSessionDir string) ([]Proc, error) {
	return readPids(hostSessionDir, pidsOf(hostSessionDir))
}

// readPids is ReadPids with the pids of the file mapped to host pids by
// host (0: no such process).
func readPids(hostSessionDir string, host func(int) int) ([]Proc, error) {
	data, err := os.ReadFile(filepath.Join(hostSessionDir, "pids"))
	if err != nil {
		return nil, err
	}
	var out []Proc
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 {
			continue
		}
		p := Proc{Kind: f[0], PID: pid}
		if h := host(pid); h > 0 {
			p.PID = h
			if st, ok := ReadStat(h); ok {
				p.StartTicks = st.StartTicks
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// Kinds lists the kinds in procs, in order.
func Kinds(procs []Proc) []string {
	var out []string
	for _, p := range procs {
		out = append(out, p.Kind)
	}
	return out
}

// Live keeps the processes that are still alive.
func Live(procs []Proc) []Proc {
	var out []Proc
	for _, p := range procs {
		if p.Alive() {
			out = append(out, p)
		}
	}
	return out
}

// pids lists every process id in /proc.
func pids() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	sort.Ints(out)
	return out
}

// bindRoots returns the roots of the mounts at mountPoint that
// /proc/PID/mountinfo lists: for a process of a local sandbox, the host
// folder of that sandbox.
func bindRoots(pid int, mountPoint string) []string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint ...
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && unescapeMount(fields[4]) == mountPoint {
			out = append(out, unescapeMount(fields[3]))
		}
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// environHas reports whether the process's environment holds an entry for
// which match is true.
func environHas(pid int, match func(string) bool) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if match(string(kv)) {
			return true
		}
	}
	return false
}

// tagOf returns the launch tag in the process's environment ("" if none).
func tagOf(pid int) string {
	var tag string
	environHas(pid, func(kv string) bool {
		if v, ok := strings.CutPrefix(kv, proto.TagEnv+"="); ok {
			tag = v
			return true
		}
		return false
	})
	return tag
}

// cmdline is the process's command line, for messages.
func cmdline(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " "))
}

// Describe names a process for a failure message.
func Describe(pid int) string {
	st, ok := ReadStat(pid)
	if !ok {
		return fmt.Sprintf("%d (gone)", pid)
	}
	return fmt.Sprintf("%d %c (%s) %q", pid, st.State, st.Comm, cmdline(pid))
}

// killByPidfd kills pid if it still satisfies ours once a pidfd holds it,
// so a reused pid is never signalled. It sends SIGKILL and then SIGCONT.
func killByPidfd(pid int, ours func(int) bool) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if !ours(pid) {
		return false
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	_ = unix.PidfdSendSignal(fd, unix.SIGCONT, nil, 0)
	return true
}

// Kill sends SIGKILL to the process if it is still the one that was read
// (same pid and start time, checked once a pidfd holds it). It reports
// whether it did.
func (p Proc) Kill() bool {
	return killByPidfd(p.PID, func(pid int) bool {
		st, ok := ReadStat(pid)
		return ok && p.StartTicks != 0 && st.StartTicks == p.StartTicks
	})
}
