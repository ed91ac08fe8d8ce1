// Package proctest is the one reader of /proc for the test kits and tests
// of the module: a process's stat (state, parent, name, CPU time, start
// time), its children, its environment (the launch tag), its command line
// and its mounts, and the kill that signals a process only while a pidfd
// holds it and it is still the one the test means (so a reused pid is
// never signalled). Processes are named by pid and start time; nothing is
// found or killed by name.
//
// It is for tests only. ngsup's own reader is pkg/reaper; cmd/ngsup's
// end-to-end tests keep a reader of their own on purpose, as the oracle
// that checks pkg/reaper independently.
package proctest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Stat is what the tests read of /proc/PID/stat.
type Stat struct {
	PID        int    // the process id
	Comm       string // field 2, the command name
	State      byte   // field 3 (R, S, T, Z, ...)
	PPID       int    // field 4, the parent's pid
	UTime      uint64 // field 14, clock ticks
	STime      uint64 // field 15, clock ticks
	StartTicks uint64 // field 22, clock ticks since boot
}

// CPU is the process's CPU time so far (user + system), in clock ticks.
func (s Stat) CPU() uint64 { return s.UTime + s.STime }

// Live reports whether the process still runs: it is no zombie and not
// dead.
func (s Stat) Live() bool { return s.State != 'Z' && s.State != 'X' }

// ReadStat reads /proc/PID/stat; ok is false when the process is gone.
func ReadStat(pid int) (Stat, bool) {
	return readStat(pid, fmt.Sprintf("/proc/%d/stat", pid))
}

// ReadTaskStat reads /proc/PID/task/TID/stat, one thread's stat; ok is
// false when the thread is gone.
func ReadTaskStat(pid, tid int) (Stat, bool) {
	return readStat(pid, fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
}

// readStat parses the stat file at path, of process pid.
func readStat(pid int, path string) (Stat, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Stat{}, false
	}
	// The command name may hold spaces and parentheses: it ends at the
	// last ')'.
	open := bytes.IndexByte(data, '(')
	closing := bytes.LastIndexByte(data, ')')
	if open < 0 || closing < open {
		return Stat{}, false
	}
	f := strings.Fields(string(data[closing+1:]))
	// f[0] is field 3 (state): field N is f[N-3].
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, false
	}
	num := func(i int) uint64 {
		n, _ := strconv.ParseUint(f[i], 10, 64)
		return n
	}
	ppid, _ := strconv.Atoi(f[1])
	return Stat{
		PID: pid, Comm: string(data[open+1 : closing]), State: f[0][0], PPID: ppid,
		UTime: num(11), STime: num(12), StartTicks: num(19),
	}, true
}

// StartTicks is the process's start time, in clock ticks since boot; ok
// is false when it is gone.
func StartTicks(pid int) (uint64, bool) {
	st, ok := ReadStat(pid)
	return st.StartTicks, ok
}

// State is the process's state letter, 0 when it is gone.
func State(pid int) byte {
	st, _ := ReadStat(pid)
	return st.State
}

// Same reports whether pid is still the process that started at start
// and still runs (no zombie).
func Same(pid int, start uint64) bool {
	st, ok := ReadStat(pid)
	return ok && st.StartTicks == start && st.Live()
}

// Tasks lists the process's thread ids, in order (none when it is gone).
func Tasks(pid int) []int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	slices.Sort(out)
	return out
}

// StopPending reports whether SIGSTOP is pending for thread tid of pid, in
// the process's shared set or the thread's own (ShdPnd, SigPnd of
// /proc/PID/task/TID/status).
func StopPending(pid, tid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		return false
	}
	const bit = uint64(1) << (unix.SIGSTOP - 1)
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != "ShdPnd" && k != "SigPnd" {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && n&bit != 0 {
			return true
		}
	}
	return false
}

// Held reports whether the process that started at start is alive and runs
// no code of its own: every live thread stopped (T, t) or bound to stop
// before its next instruction, because SIGSTOP is pending for it or a
// group stop is under way (another of its threads is stopped). A pause
// confirms a thread in an uninterruptible call (D) with SIGSTOP pending as
// held: it stops when the call returns, and until then reads D, then R
// or S for a moment. A process that is gone, or whose pid is another's
// now, is not held. why says what was seen.
func Held(pid int, start uint64) (held bool, why string) {
	st, ok := ReadStat(pid)
	if !ok || st.StartTicks != start {
		return false, "gone"
	}
	var anyStopped bool
	var moving []Stat
	for _, tid := range Tasks(pid) {
		ts, ok := ReadTaskStat(pid, tid)
		switch {
		case !ok, ts.State == 'Z', ts.State == 'X':
		case ts.State == 'T' || ts.State == 't':
			anyStopped = true
		default:
			ts.PID = tid
			moving = append(moving, ts)
		}
	}
	if !anyStopped && len(moving) == 0 {
		return false, "dead"
	}
	for _, ts := range moving {
		if !anyStopped && !StopPending(pid, ts.PID) {
			return false, fmt.Sprintf("thread %d in state %c without SIGSTOP pending", ts.PID, ts.State)
		}
	}
	return true, "stopped"
}

// Pids lists every process id in /proc, in order.
func Pids() []int {
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
	slices.Sort(out)
	return out
}

// Children lists the process's children, from the children file of each
// of its threads.
func Children(pid int) []int {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, w := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(w); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// Descendants lists the processes below pid, nearest first.
func Descendants(pid int) []int {
	var out []int
	seen := map[int]bool{pid: true}
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		for _, c := range Children(queue[0]) {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out
}

// Env is one variable of the process's environment; ok is false when it
// is unset or the process is gone. (While a process is in the middle of an
// execve its environment reads empty.)
func Env(pid int, key string) (string, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return "", false
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(key+"=")); ok {
			return string(v), true
		}
	}
	return "", false
}

// Tag is the launch tag in the process's environment (proto.TagEnv), ""
// if none.
func Tag(pid int) string {
	v, _ := Env(pid, proto.TagEnv)
	return v
}

// Cmdline is the process's command line, its arguments joined by spaces
// ("" when it is gone).
func Cmdline(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " "))
}

// Describe names a process for a failure message: pid, state, name and
// command line.
func Describe(pid int) string {
	st, ok := ReadStat(pid)
	if !ok {
		return fmt.Sprintf("%d (gone)", pid)
	}
	return fmt.Sprintf("%d %c (%s) %q", pid, st.State, st.Comm, Cmdline(pid))
}

// MountRoots lists the roots of the mounts at mountPoint in the process's
// mount namespace (/proc/PID/mountinfo): for a process of a local sandbox,
// the host folder of that sandbox.
func MountRoots(pid int, mountPoint string) []string {
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

// Kill sends SIGKILL, then SIGCONT (so a stopped process dies too), to pid
// if, once a pidfd holds it, ours still says it is the test's process; it
// reports whether it did. Holding the pidfd first means the check and the
// signal are about the same process, never one that reused the pid.
func Kill(pid int, ours func(pid int) bool) bool {
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

// KillSame is Kill of the process that started at start (Same): it
// reports whether it sent the signals.
func KillSame(pid int, start uint64) bool {
	return Kill(pid, func(p int) bool { return Same(p, start) })
}
