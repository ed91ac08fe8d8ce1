package reaper

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// The identity guarantees of a pause's per-process work, each proven on
// real processes (issue 22: a faster pause keeps every one of them).

// waitState polls pid's stat until its state is one of states, or fails
// after budget.
func waitState(t *testing.T, pid int, states string, budget time.Duration) Stat {
	t.Helper()
	deadline := time.Now().Add(budget)
	for {
		st, err := ProcFS.ReadStat(pid)
		if err == nil && strings.IndexByte(states, st.State) >= 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: state %q (%v) after %s, want one of %q", pid, st.State, err, budget, states)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSignalRefusesAnotherProcess proves that a process is signalled only if
// it is still the one that was checked: a live process named with another
// start time (its pid reused, as far as the caller knows), or with its own
// start time but another pidfs inode (a pid reused within one clock tick),
// is refused with ErrNotSameProcess and receives nothing; named rightly, it
// is signalled.
func TestSignalRefusesAnotherProcess(t *testing.T) {
	cmd := startSleeper(t, "identity")
	pid := cmd.Process.Pid
	st := waitState(t, pid, "S", 10*time.Second)
	me := procOf(st)
	stranger := proto.Proc{PID: pid, StartTicks: st.StartTicks + 1}
	if err := ProcFS.Signal(stranger, unix.SIGSTOP); err != ErrNotSameProcess {
		t.Errorf("Signal with another start time: %v, want ErrNotSameProcess", err)
	}
	if havePidfs() {
		ino := ProcFS.Inode(me)
		if ino == 0 {
			t.Fatal("no pidfs inode for a live child")
		}
		if err := ProcFS.signalAs(me, ino+1, unix.SIGSTOP); err != ErrNotSameProcess {
			t.Errorf("signalAs with another pidfs inode: %v, want ErrNotSameProcess", err)
		}
	}
	// Nothing reached it: still asleep a while after.
	time.Sleep(50 * time.Millisecond)
	if now, err := ProcFS.ReadStat(pid); err != nil || now.State != 'S' {
		t.Fatalf("after the refused signals the sleeper is %q (%v), want S", now.State, err)
	}
	if err := ProcFS.Signal(me, unix.SIGSTOP); err != nil {
		t.Fatalf("Signal of the process itself: %v", err)
	}
	waitState(t, pid, "T", 10*time.Second)
	if err := ProcFS.Signal(me, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// TestPassChecksParentInEveryWorker proves that a pass acts only on a
// process listed under a parent that is still its parent, also when a long
// level of the pass is shared by several workers: of 80 children of this
// test, the 40 listed under this process are visited and found, the 40
// listed under another parent (as a pid reused by someone else's process
// would be) are neither visited nor found.
func TestPassChecksParentInEveryWorker(t *testing.T) {
	const n = 80
	self := os.Getpid()
	l := &Launch{Dir: t.TempDir(), FS: ProcFS}
	f := newFinder(l)
	f.workers = 4
	if n/levelShare < 2 {
		t.Fatalf("a level of %d is walked by one worker; the test needs several", n)
	}
	var level []candidate
	right := map[int]bool{}
	for i := range n {
		pid := startSleeper(t, "parent").Process.Pid
		parent := self
		if i%2 == 1 {
			parent = 1 // not its parent
		} else {
			right[pid] = true
		}
		level = append(level, candidate{pid: pid, parent: parent, src: fromChild})
	}
	visits := make(chan int, n)
	out := f.visitLevel(level, func(t *target) { visits <- t.PID })
	close(visits)
	for i, v := range out {
		if v.ok != right[level[i].pid] {
			t.Errorf("pid %d listed under %d: found %v, want %v", level[i].pid, level[i].parent, v.ok, right[level[i].pid])
		}
	}
	seen := 0
	for pid := range visits {
		seen++
		if !right[pid] {
			t.Errorf("pid %d was visited though listed under a parent it does not have", pid)
		}
	}
	if seen != len(right) {
		t.Errorf("%d visits, want %d", seen, len(right))
	}
}

// TestPassChecksKnownInode proves that a process named by the known set is
// acted on only if its pidfd has the pidfs inode recorded with it: a live
// process recorded with its pid and start time but another inode (what a
// pid reused within one clock tick looks like) is neither visited nor
// found; recorded with its own inode, it is.
func TestPassChecksKnownInode(t *testing.T) {
	if !havePidfs() {
		t.Skip("no pidfs here (Linux before 6.9): the known set carries no inode")
	}
	cmd := startSleeper(t, "known")
	st := waitState(t, cmd.Process.Pid, "S", 10*time.Second)
	p := procOf(st)
	ino := ProcFS.Inode(p)
	for _, tc := range []struct {
		name  string
		inode uint64
		found bool
	}{{"another inode", ino + 1, false}, {"its inode", ino, true}} {
		dir := t.TempDir()
		line := formatProcSet([]proto.Proc{p}, func(proto.Proc) uint64 { return tc.inode })
		if err := os.WriteFile(filepath.Join(dir, proto.KnownFile), line, 0o644); err != nil {
			t.Fatal(err)
		}
		// No receipt: the supervisor is gone, the known set is followed.
		l := &Launch{Dir: dir, FS: ProcFS}
		visited := false
		found := newFinder(l).pass(func(t *target) { visited = visited || t.PID == p.PID })
		if _, ok := found[p.PID]; ok != tc.found || visited != tc.found {
			t.Errorf("%s: found %v, visited %v; want %v", tc.name, ok, visited, tc.found)
		}
	}
}

// TestPauseRecordsKnownWithInodes proves that the supervisor records the
// harness in the known set with its pidfs inode, that a pause leaves every process
// it holds in the launch's known set with its pidfs inode (so that a stop
// after the supervisor is gone tells each apart from a newcomer with its
// pid and start time), that a process recorded without an inode is recorded
// again with it, and that a second pause does not record again what is
// recorded already. The tree is long enough for the pass's workers.
func TestPauseRecordsKnownWithInodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, like the benchmark launches")
	}
	if !havePidfs() {
		t.Skip("no pidfs here (Linux before 6.9): the known set carries no inode")
	}
	bl := startBenchLaunch(t, benchTree{name: "flat", script: flatScript, arg: "100", processes: 101})
	known := filepath.Join(bl.dir, proto.KnownFile)
	// The supervisor recorded the harness, with its inode, as it started.
	r, err := proto.ReadReceipt(bl.dir)
	if err != nil {
		t.Fatal(err)
	}
	harness := proto.Proc{PID: r.HarnessPID, StartTicks: r.HarnessStartTicks}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, inodes, _ := readProcSet(known)
		if ino, ok := inodes[harness]; ok {
			if want := ProcFS.Inode(harness); ino != want {
				t.Errorf("the supervisor recorded the harness %v with inode %d, its pidfd has %d", harness, ino, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the supervisor did not record the harness %v in %s", harness, known)
		}
	}
	pause := func() []proto.Proc {
		t.Helper()
		res, code, err := Pause(bl.dir, PauseOptions{})
		if err != nil || code != proto.ExitOK || res.Processes != 101 {
			t.Fatalf("pause: code %d, %v, %+v", code, err, res)
		}
		held, _, _ := readProcSet(filepath.Join(bl.dir, proto.PausedFile))
		if _, code, err := Continue(bl.dir); err != nil || code != proto.ExitOK {
			t.Fatalf("continue: code %d, %v", code, err)
		}
		return held
	}
	lines := func() int {
		data, _ := os.ReadFile(known)
		return strings.Count(string(data), "\n")
	}
	check := func(when string, held []proto.Proc) {
		t.Helper()
		_, inodes, _ := readProcSet(known)
		for _, p := range held {
			if want := ProcFS.Inode(p); inodes[p] != want || want == 0 {
				t.Errorf("%s: %v recorded with inode %d, its pidfd has %d", when, p, inodes[p], want)
			}
		}
	}
	held := pause()
	check("after the first pause", held)
	n := lines()
	check("after a second pause", pause())
	if lines() != n {
		t.Errorf("a second pause of the same processes made the known set %d lines long, was %d", lines(), n)
	}
	// Records without inodes (as an older ngsup, or a kernel without
	// pidfs, wrote them) are completed by the next pause.
	if err := os.WriteFile(known, formatProcSet(held, noInode), 0o644); err != nil {
		t.Fatal(err)
	}
	check("after a pause of processes recorded without inodes", pause())
}

// TestPauseStopsGroupMemberContinuedAfterGroupStop proves that a pause does
// not count on the harness's group SIGSTOP beyond its first pass: the
// members of the group, stopped by the group's signal and then continued by
// something else in the launch (this test plays it, after the group's
// signal and before the first pass), are signalled by the later passes one
// by one and held. Without the cgroup, signals alone.
func TestPauseStopsGroupMemberContinuedAfterGroupStop(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, like the benchmark launches")
	}
	tree := benchTree{name: "flat", script: flatScript, arg: "5", processes: 6}
	bl := startSupervised(t, tree, launchOptions{cgroupFD: -1, noCgroup: true})
	bl.waitBuilt(t, tree.processes, time.Minute)
	l, _, unlock, _, err := openFor(VerbPause, bl.dir, "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	p := newPauser(l, PauseOptions{NoCgroup: true})
	defer p.undo()
	if p.grouped = l.signalGroup(unix.SIGSTOP); !p.grouped {
		t.Fatal("the harness's group could not be signalled")
	}
	all := func(state byte) bool {
		n, inState := 0, 0
		queue := []int{bl.sup.PID}
		for len(queue) > 0 {
			pid := queue[0]
			queue = queue[1:]
			st, err := ProcFS.ReadStat(pid)
			if err != nil {
				continue
			}
			if pid != bl.sup.PID {
				n++
				if st.State == state {
					inState++
				}
			}
			kids, _ := ProcFS.Children(pid, st.NumThreads, nil)
			queue = append(queue, kids...)
		}
		return n == tree.processes && inState == n
	}
	waitAll := func(state byte) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !all(state); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the tree is not all %q", state)
			}
		}
	}
	waitAll('T')
	l.signalGroup(unix.SIGCONT) // the hostile part: after the group's signal
	waitAll('S')
	for deadline := time.Now().Add(3 * time.Second); len(p.step()) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after %d passes %d processes are not stopped: %+v", p.passes, len(p.pending), p.pending)
		}
	}
	if !all('T') {
		t.Fatal("the pause's passes ended with processes not stopped")
	}
}
