package execd

import (
	"bytes"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ProcsIn lists the live processes (zombies left out) that run in a
// sandbox whose host folder is bind-mounted at mountPoint in their mount
// namespace: every process started in the sandbox, and every one they
// left behind.
func ProcsIn(hostFolder, mountPoint string) []int {
	host, err := os.Stat(hostFolder)
	if err != nil {
		return nil
	}
	return procsIn(host, mountPoint)
}

func procsIn(host os.FileInfo, mountPoint string) []int {
	var out []int
	for _, pid := range allPids() {
		if inSandbox(pid, host, mountPoint) {
			out = append(out, pid)
		}
	}
	return out
}

// KillIn kills (SIGKILL, then SIGCONT so a stopped one dies) every process
// running in the sandbox, as a container's processes end with it. Each is
// held by a pidfd and checked again before the signal, so a reused pid is
// never signalled. It returns how many it killed, after waiting (up to 10
// s) for them to be gone.
func KillIn(hostFolder, mountPoint string) int {
	host, err := os.Stat(hostFolder)
	if err != nil {
		return 0
	}
	return KillInFolder(host, mountPoint)
}

// KillInFolder is KillIn for the folder fi describes (it may have been
// renamed since: it is found by its inode).
func KillInFolder(host os.FileInfo, mountPoint string) int {
	killed := 0
	for round := 0; round < 5; round++ {
		pids := procsIn(host, mountPoint)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if killPid(pid, func(p int) bool { return inSandbox(p, host, mountPoint) }) {
				killed++
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(procsIn(host, mountPoint)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return killed
}

func killPid(pid int, ours func(int) bool) bool {
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

// Describe names a process for a message: pid, state, name and command
// line.
func Describe(pid int) string {
	st, comm, ok := stat(pid)
	if !ok {
		return fmt.Sprintf("%d (gone)", pid)
	}
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return fmt.Sprintf("%d %c (%s) %q", pid, st, comm, strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")))
}

// inSandbox reports whether the process sees the host folder at the mount
// point: /proc/PID/root resolves the path in the process's own mount
// namespace, so the folder it finds there is the one bind-mounted for it.
func inSandbox(pid int, host os.FileInfo, mountPoint string) bool {
	st, _, ok := stat(pid)
	if !ok || st == 'Z' || st == 'X' {
		return false
	}
	fi, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", pid, mountPoint))
	return err == nil && os.SameFile(fi, host)
}

func stat(pid int) (state byte, comm string, ok bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", false
	}
	open := bytes.IndexByte(data, '(')
	closing := bytes.LastIndexByte(data, ')')
	if open < 0 || closing < open || closing+2 >= len(data) {
		return 0, "", false
	}
	return data[closing+2], string(data[open+1 : closing]), true
}

func allPids() []int {
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
