package harnesstest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// ProcStat is what the tests read of /proc/PID/stat.
type ProcStat struct {
	PID        int    // the process id
	Comm       string // field 2, the command name
	State      byte   // field 3 (R, S, T, Z, ...)
	PPID       int    // field 4, the parent's pid
	UTime      uint64 // field 14, clock ticks
	STime      uint64 // field 15
	StartTicks uint64 // field 22
}

// CPU is the process's CPU time so far (user + system), in clock ticks.
func (s ProcStat) CPU() uint64 { return s.UTime + s.STime }

// ReadStat reads /proc/PID/stat; ok is false when the process is gone.
func ReadStat(pid int) (ProcStat, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcStat{}, false
	}
	open := bytes.IndexByte(data, '(')
	closing := bytes.LastIndexByte(data, ')')
	if open < 0 || closing < open {
		return ProcStat{}, false
	}
	f := strings.Fields(string(data[closing+1:]))
	// f[0] is field 3 (state): field N is f[N-3].
	if len(f) < 20 || len(f[0]) != 1 {
		return ProcStat{}, false
	}
	num := func(i int) uint64 {
		n, _ := strconv.ParseUint(f[i], 10, 64)
		return n
	}
	ppid, _ := strconv.Atoi(f[1])
	return ProcStat{
		PID: pid, Comm: string(data[open+1 : closing]), State: f[0][0], PPID: ppid,
		UTime: num(11), STime: num(12), StartTicks: num(19),
	}, true
}

// SameProc reports whether pid is still the process that started at start
// and is not a zombie.
func SameProc(pid int, start uint64) bool {
	st, ok := ReadStat(pid)
	return ok && st.StartTicks == start && st.State != 'Z' && st.State != 'X'
}

// ProcInfo is a live process as the leak checks see it.
type ProcInfo struct {
	// Stat is its /proc/PID/stat.
	Stat ProcStat
	// Tag is its launch tag ("" if none).
	Tag string
	// MountRoot is the host folder mounted at /sandbox in its namespace.
	MountRoot string
	// Cmdline is its command line, cut at 160 bytes.
	Cmdline string
}

// String is one line about p, for logs.
func (p ProcInfo) String() string {
	return fmt.Sprintf("%d %c (%s) tag=%q sandbox=%q %q", p.Stat.PID, p.Stat.State, p.Stat.Comm, p.Tag, p.MountRoot, p.Cmdline)
}

// DescribeAll is one line about ps, for logs.
func DescribeAll(ps []ProcInfo) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, "; ")
}

// Leftovers lists the live processes (zombies left out) that match.
func Leftovers(match func(ProcInfo) bool) []ProcInfo {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []ProcInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		st, ok := ReadStat(pid)
		if !ok || st.State == 'Z' || st.State == 'X' {
			continue
		}
		p := ProcInfo{Stat: st, Tag: TagOf(pid), MountRoot: SandboxRoot(pid), Cmdline: cmdline(pid)}
		if match(p) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stat.PID < out[j].Stat.PID })
	return out
}

// TagOf is the launch tag in the process's environment ("" if none).
func TagOf(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(proto.TagEnv+"=")); ok {
			return string(v)
		}
	}
	return ""
}

// EnvOf is one variable of the process's environment ("" if unset).
func EnvOf(pid int, key string) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(key+"=")); ok {
			return string(v)
		}
	}
	return ""
}

// SandboxRoot is the root of the mount at /sandbox in the process's mount
// namespace: for a process of a local sandbox, that sandbox's host folder
// (as its filesystem names it). "" when nothing is mounted there.
func SandboxRoot(pid int) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint ...
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && fields[4] == "/sandbox" {
			return fields[3]
		}
	}
	return ""
}

func cmdline(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "?"
	}
	s := strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " "))
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}

// KillIdentified kills p (SIGKILL, then SIGCONT so a stopped one dies) if a
// pidfd still holds the same process (same start time), so a reused pid is
// never signalled.
func KillIdentified(p ProcInfo) {
	fd, err := unix.PidfdOpen(p.Stat.PID, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if !SameProc(p.Stat.PID, p.Stat.StartTicks) {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	_ = unix.PidfdSendSignal(fd, unix.SIGCONT, nil, 0)
}

// Tree runs `ngsup tree --dir DIR --json` on the host with the built ngsup
// ngsupHost: the processes of the launch whose folder is at hostDir.
func Tree(ngsupHost, hostDir string) (proto.TreeResult, error) {
	cmd := exec.Command(ngsupHost, "tree", "--dir", hostDir, "--json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return proto.TreeResult{}, fmt.Errorf("ngsup tree --dir %s: %v: %s", hostDir, err, strings.TrimSpace(stderr.String()))
	}
	var t proto.TreeResult
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &t); err != nil {
		return t, fmt.Errorf("ngsup tree --dir %s printed %q: %v", hostDir, stdout.String(), err)
	}
	return t, nil
}
