package harnesstest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/pkg/proto"
)

// ProcInfo is a live process as the leak checks see it.
type ProcInfo struct {
	// Stat is its /proc/PID/stat.
	Stat proctest.Stat
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
	var out []ProcInfo
	for _, pid := range proctest.Pids() {
		if pid == os.Getpid() {
			continue
		}
		st, ok := proctest.ReadStat(pid)
		if !ok || !st.Live() {
			continue
		}
		p := ProcInfo{Stat: st, Tag: proctest.Tag(pid), MountRoot: sandboxRoot(pid), Cmdline: cmdline(pid)}
		if match(p) {
			out = append(out, p)
		}
	}
	return out
}

// sandboxRoot is the root of the mount at /sandbox in the process's mount
// namespace: for a process of a local sandbox, that sandbox's host folder
// (as its filesystem names it). "" when nothing is mounted there.
func sandboxRoot(pid int) string {
	if roots := proctest.MountRoots(pid, "/sandbox"); len(roots) > 0 {
		return roots[0]
	}
	return ""
}

// cmdline is the process's command line for a log line, cut at 160 bytes.
func cmdline(pid int) string {
	s := proctest.Cmdline(pid)
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}

// KillIdentified kills p (SIGKILL, then SIGCONT so a stopped one dies) if a
// pidfd still holds the same process (same start time), so a reused pid is
// never signalled.
func KillIdentified(p ProcInfo) { proctest.KillSame(p.Stat.PID, p.Stat.StartTicks) }

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
