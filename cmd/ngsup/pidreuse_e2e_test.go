package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

func init() {
	fixtures["pid-reuse"] = fixturePidReuse
}

// pidReuseReport is what the pid-reuse fixture prints.
type pidReuseReport struct {
	Tries  int    `json:"tries"`
	Reused bool   `json:"reused"`
	BAlive bool   `json:"b_alive"`
	CAlive bool   `json:"c_alive"`
	Stop   string `json:"stop"`
	Error  string `json:"error,omitempty"`
}

// pidfdInode is the pidfs inode number of pid (fstat of a pidfd).
func pidfdInode(pid int) (uint64, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// fixturePidReuse runs as pid 1 of a pid namespace of its own, with a mount
// namespace in which it mounts that namespace's /proc. Args: the ngsup
// binary, a launch folder, a launch id. It starts a sleep A, records its
// pid, start time and pidfs inode, kills it, and (writing ns_last_pid) has
// the next sleep B get A's pid, retrying until B also has A's start time:
// a pid reused within one clock tick. It starts a third sleep C, writes A
// and C to the folder's known set with their inodes, runs `ngsup stop --id`
// (no receipt: the known set is used), and prints whether B and C live.
// Its exit ends everything in the namespace.
func fixturePidReuse(args []string) int {
	rep := pidReuseReport{}
	defer func() { json.NewEncoder(os.Stdout).Encode(rep) }()
	fail := func(err error) int { rep.Error = err.Error(); return 0 }
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail(fmt.Errorf("make mounts private: %w", err))
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		return fail(fmt.Errorf("mount proc: %w", err))
	}
	bin, dir, id := args[0], args[1], args[2]
	start := func() (*exec.Cmd, proc, uint64, error) {
		cmd := exec.Command("/bin/sleep", "1000")
		cmd.Env = []string{}
		if err := cmd.Start(); err != nil {
			return nil, proc{}, 0, err
		}
		st, err := readStat(cmd.Process.Pid)
		if err != nil {
			return cmd, proc{}, 0, err
		}
		ino, err := pidfdInode(cmd.Process.Pid)
		return cmd, proc{cmd.Process.Pid, st.Start}, ino, err
	}
	var a proc
	var aIno uint64
	var b *exec.Cmd
	for rep.Tries = 1; rep.Tries <= 500 && !rep.Reused; rep.Tries++ {
		ac, ap, ino, err := start()
		if err != nil {
			return fail(err)
		}
		ac.Process.Kill()
		ac.Wait()
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(ap.PID-1)), 0); err != nil {
			return fail(fmt.Errorf("write ns_last_pid: %w", err))
		}
		bc, bp, _, err := start()
		if err != nil {
			return fail(err)
		}
		if bp == ap {
			a, aIno, b, rep.Reused = ap, ino, bc, true
			break
		}
		bc.Process.Kill()
		bc.Wait()
	}
	if !rep.Reused {
		return 0
	}
	cc, c, cIno, err := start()
	if err != nil {
		return fail(err)
	}
	known := fmt.Sprintf("%d %d %d\n%d %d %d\n", a.PID, a.Start, aIno, c.PID, c.Start, cIno)
	if err := os.WriteFile(filepath.Join(dir, proto.KnownFile), []byte(known), 0o644); err != nil {
		return fail(err)
	}
	out, _ := exec.Command(bin, "stop", "--dir", dir, "--id", id, "--grace", "0s").CombinedOutput()
	rep.Stop = string(out)
	go cc.Wait()
	time.Sleep(50 * time.Millisecond)
	rep.BAlive, rep.CAlive = alive(a), alive(c)
	b.Process.Kill()
	return 0
}

// TestStopSparesPidReusedWithinATick proves that a process recorded in the
// known set with its pidfs inode is told apart from another process that
// got its pid within the same clock tick (same pid AND start time): in a pid
// namespace of its own, ns_last_pid makes the reuse; `ngsup stop` then ends
// the recorded process that still lives (C) and leaves the newcomer (B)
// alone. Needs root; skipped where no pid namespace or pidfs can be had.
func TestStopSparesPidReusedWithinATick(t *testing.T) {
	t.Parallel()
	requireRoot(t, "a pid namespace, a proc mount and ns_last_pid need root")
	if _, err := pidfdInode(os.Getpid()); err != nil {
		t.Skipf("no pidfd here: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "launch")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testBin, ngsupBin, dir, "e2e-pid-reuse-"+itoa(os.Getpid()))
	cmd.Env = append(baseEnv(), helperEnv+"=pid-reuse")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS}
	cmd.Stderr = os.Stderr
	done := make(chan struct{})
	t.Cleanup(func() {
		if cmd.Process != nil {
			cmd.Process.Kill() // pid 1 of the namespace: its death ends the rest
			<-done
		}
	})
	out, err := func() ([]byte, error) {
		defer close(done)
		return cmd.Output()
	}()
	if err != nil {
		t.Skipf("cannot run in a pid namespace of its own: %v %s", err, out)
	}
	var rep pidReuseReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("fixture printed %q: %v", out, err)
	}
	switch {
	case rep.Error != "":
		t.Skipf("the fixture could not set up the reuse: %s", rep.Error)
	case !rep.Reused:
		t.Skipf("no pid reused within one clock tick in %d tries", rep.Tries)
	}
	t.Logf("pid reused within one tick after %d tries; stop said %s", rep.Tries, rep.Stop)
	if !rep.BAlive {
		t.Errorf("stop killed the process that got a dead launch process's pid and start time")
	}
	if rep.CAlive {
		t.Errorf("stop left the recorded launch process alive")
	}
}
