package reaper

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// TestCgroupRelease proves that Release leaves a cgroup a live process is
// in (and says so at once, without waiting out its budget), and removes it
// once that process has exited and been reaped.
func TestCgroupRelease(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a cgroup is made only as root")
	}
	cg, err := CreateCgroup(fmt.Sprintf("ngsup-test-release-%d", os.Getpid()))
	if err != nil {
		t.Skipf("no writable cgroup here: %v", err)
	}
	t.Cleanup(func() { cg.Remove() })
	cmd := exec.Command("/bin/sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := cg.write("cgroup.procs", strconv.Itoa(cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if cg.Release(time.Minute, false) {
		t.Fatalf("Release removed %s with a live member", cg.Path)
	}
	if d := time.Since(begin); d > 30*time.Second {
		t.Errorf("Release waited %s on a cgroup a live process is in", d)
	}
	if _, err := os.Stat(cg.Path); err != nil {
		t.Fatalf("the cgroup is gone: %v", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if !cg.Release(10*time.Second, false) {
		t.Fatalf("Release left %s once its member was reaped", cg.Path)
	}
	if _, err := os.Stat(cg.Path); !os.IsNotExist(err) {
		t.Errorf("the cgroup is still there: %v", err)
	}
}
