package codexe2e

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

// procStat is what the tests read of /proc/PID/stat.
type procStat struct {
	PID        int
	Comm       string
	State      byte
	PPID       int
	UTime      uint64 // field 14, clock ticks
	STime      uint64 // field 15
	StartTicks uint64 // field 22
}

// CPU is the process's CPU time so far (user + system), in clock ticks.
func (s procStat) CPU() uint64 { return s.UTime + s.STime }

// readStat reads /proc/PID/stat; ok is false when the process is gone.
func readStat(pid int) (procStat, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	open := bytes.IndexByte(data, '(')
	closing := bytes.LastIndexByte(data, ')')
	if open < 0 || closing < open {
		return procStat{}, false
	}
	f := strings.Fields(string(data[closing+1:]))
	// f[0] is field 3 (state): field N is f[N-3].
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, false
	}
	num := func(i int) uint64 {
		n, _ := strconv.ParseUint(f[i], 10, 64)
		return n
	}
	ppid, _ := strconv.Atoi(f[1])
	return procStat{
		PID: pid, Comm: string(data[open+1 : closing]), State: f[0][0], PPID: ppid,
		UTime: num(11), STime: num(12), StartTicks: num(19),
	}, true
}

// sameProc reports whether pid is still the process that started at start
// and is not a zombie.
func sameProc(pid int, start uint64) bool {
	st, ok := readStat(pid)
	return ok && st.StartTicks == start && st.State != 'Z' && st.State != 'X'
}

// procInfo is a live process as the leak checks see it.
type procInfo struct {
	stat      procStat
	tag       string // its launch tag ("" if none)
	mountRoot string // the host folder mounted at /sandbox in its namespace
	cmdline   string
}

func (p procInfo) String() string {
	return fmt.Sprintf("%d %c (%s) tag=%q sandbox=%q %q", p.stat.PID, p.stat.State, p.stat.Comm, p.tag, p.mountRoot, p.cmdline)
}

func describeAll(ps []procInfo) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, "; ")
}

// leftovers lists the live processes (zombies left out) that match.
func leftovers(match func(procInfo) bool) []procInfo {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		st, ok := readStat(pid)
		if !ok || st.State == 'Z' || st.State == 'X' {
			continue
		}
		p := procInfo{stat: st, tag: tagOf(pid), mountRoot: sandboxRoot(pid), cmdline: cmdline(pid)}
		if match(p) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].stat.PID < out[j].stat.PID })
	return out
}

// tagOf is the launch tag in the process's environment ("" if none).
func tagOf(pid int) string {
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

// envOf is one variable of the process's environment ("" if unset).
func envOf(pid int, key string) string {
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

// sandboxRoot is the root of the mount at /sandbox in the process's mount
// namespace: for a process of a local sandbox, that sandbox's host folder
// (as its filesystem names it). "" when nothing is mounted there.
func sandboxRoot(pid int) string {
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

// killIdentified kills p (SIGKILL, then SIGCONT so a stopped one dies) if a
// pidfd still holds the same process (same start time), so a reused pid is
// never signalled.
func killIdentified(p procInfo) {
	fd, err := unix.PidfdOpen(p.stat.PID, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if !sameProc(p.stat.PID, p.stat.StartTicks) {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	_ = unix.PidfdSendSignal(fd, unix.SIGCONT, nil, 0)
}

// tree runs `ngsup tree --dir DIR --json` on the host with the built ngsup:
// the processes of the launch whose folder is at hostDir.
func tree(hostDir string) (proto.TreeResult, error) {
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
