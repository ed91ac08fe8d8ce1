package execd

import (
	"fmt"
	"os"
	"time"

	"github.com/ngharness/ngharness/internal/proctest"
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
	for _, pid := range proctest.Pids() {
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
			if proctest.Kill(pid, func(p int) bool { return inSandbox(p, host, mountPoint) }) {
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

// inSandbox reports whether the process sees the host folder at the mount
// point: /proc/PID/root resolves the path in the process's own mount
// namespace, so the folder it finds there is the one bind-mounted for it.
func inSandbox(pid int, host os.FileInfo, mountPoint string) bool {
	if st, ok := proctest.ReadStat(pid); !ok || !st.Live() {
		return false
	}
	fi, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", pid, mountPoint))
	return err == nil && os.SameFile(fi, host)
}
