package main

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func init() {
	fixtures["leave-detached"] = fixtureLeaveDetached
	fixtures["outlive"] = fixtureOutlive
}

// fixtureLeaveDetached records itself as "harness", starts "outlive" in a
// session of its own and exits 0 at once.
func fixtureLeaveDetached(args []string) int {
	must(writeRecord("harness", os.Getpid()))
	cmd := helperProc("outlive", strconv.Itoa(os.Getpid()), strconv.Itoa(os.Getppid()))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	must(cmd.Start())
	return 0
}

// fixtureOutlive records itself as "detached" and exits once its parent is
// neither the harness (args[0]) nor the supervisor (args[1]) that adopts it
// when the harness exits: it outlives the supervisor, in the launch's
// cgroup, and then ends by itself. It gives up after a minute.
func fixtureOutlive(args []string) int {
	must(writeRecord("detached", os.Getpid()))
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if p := strconv.Itoa(os.Getppid()); p != args[0] && p != args[1] {
			break
		}
	}
	return 0
}

// TestCgroupRemovedAfterLaunchesEnd proves that no ngsup-<id>-* cgroup of an
// ended launch is left behind, once every process of it is gone: launches
// that exit at once (one with a child in its process group), one whose
// detached child ends by itself after the supervisor has gone (the next wait
// and status see the cgroup empty), and one whose detached child a later stop
// ends.
func TestCgroupRemovedAfterLaunchesEnd(t *testing.T) {
	t.Parallel()
	requireRoot(t, "ngsup makes the launch's cgroup only as root")
	if !cgroupFreezerMounted() {
		t.Skip("no cgroup2 or cgroup v1 freezer mount: ngsup runs launches without a cgroup here")
	}
	var launches []*launch
	started := func(l *launch) {
		t.Helper()
		launches = append(launches, l)
		l.harness() // the receipt says it started: it names the cgroup
		if rc := l.status(); rc.Cgroup == "" {
			t.Skipf("ngsup could not make a writable cgroup here (receipt %+v): nothing to leak", rc)
		}
	}
	for _, cmd := range []command{helper("harness", "-exit", "0"), helper("harness", "-bg", "-exit", "0")} {
		l := newLaunch(t)
		wantCode(t, l.foreground(nil, cmd), 0)
		started(l)
	}

	// A detached child that ends by itself after the supervisor has gone.
	self := newLaunch(t)
	self.detach(nil, helper("leave-detached"))
	started(self)
	self.wait()
	d := self.role("detached")
	wantGone(t, map[string]proc{"detached": d})
	self.wait()
	self.status()

	// A detached child that outlives the harness until a stop ends it.
	stopped := newLaunch(t)
	stopped.detach(nil, helper("harness", "-setsid", "-exit", "0"))
	started(stopped)
	stopped.wait()
	if s := stopped.role("setsid"); !alive(s) {
		t.Fatalf("fixture: the detached sleep %v is gone before the stop", s)
	}
	stopped.stop("1s")

	for _, l := range launches {
		rc := l.status()
		if _, err := os.Stat(rc.Cgroup); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("launch %s ended, its cgroup %s is still there (%v)", l.ID, rc.Cgroup, err)
		}
		if left := cgroupsOf(l.ID); len(left) > 0 {
			t.Errorf("launch %s ended, cgroups left: %v", l.ID, left)
		}
	}
}
