package drivertest

import (
	"fmt"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/pkg/driver/fake"
)

// Proc is one process a fake harness recorded in its session's pids file,
// with the start time it had when the test read the file.
type Proc struct {
	Kind       string // harness, child, own_session, daemon, untagged
	PID        int
	StartTicks uint64 // 0 when it was already gone when read
}

func (p Proc) String() string { return fmt.Sprintf("%s %d", p.Kind, p.PID) }

// Alive reports whether the process is still the one that was read (same
// pid and start time) and not a zombie.
func (p Proc) Alive() bool {
	if p.StartTicks == 0 {
		return false
	}
	return proctest.Same(p.PID, p.StartTicks)
}

// State is the process's state letter now ('-' when it is gone or its pid
// belongs to another process now).
func (p Proc) State() byte {
	st, ok := proctest.ReadStat(p.PID)
	if !ok || st.StartTicks != p.StartTicks {
		return '-'
	}
	return st.State
}

// Held reports whether the process is still the one that was read and is
// held by a pause (proctest.Held: every thread stopped or bound to stop
// before it runs again); why says what was seen.
func (p Proc) Held() (bool, string) {
	if p.StartTicks == 0 {
		return false, "gone when read"
	}
	return proctest.Held(p.PID, p.StartTicks)
}

// ReadPids reads a fake harness's pids file (on the host) and the start
// time of each process in it. In a container of a real engine (an Env on
// BackendRealDocker) the file's pids are the container's:
// each is read as the host pid of that process, and one whose process is
// gone reads as gone.
func ReadPids(hostSessionDir string) ([]Proc, error) {
	return readPids(hostSessionDir, pidsOf(hostSessionDir))
}

// readPids is ReadPids with the pids of the file mapped to host pids by
// host (0: no such process).
func readPids(hostSessionDir string, host func(int) int) ([]Proc, error) {
	recorded, err := fake.ReadPids(hostSessionDir)
	if err != nil {
		return nil, err
	}
	var out []Proc
	for _, r := range recorded {
		p := Proc{Kind: r.Kind, PID: r.PID}
		if h := host(r.PID); h > 0 {
			p.PID = h
			p.StartTicks, _ = proctest.StartTicks(h)
		}
		out = append(out, p)
	}
	return out, nil
}

// Kinds lists the kinds in procs, in order.
func Kinds(procs []Proc) []string {
	var out []string
	for _, p := range procs {
		out = append(out, p.Kind)
	}
	return out
}

// Live keeps the processes that are still alive.
func Live(procs []Proc) []Proc {
	var out []Proc
	for _, p := range procs {
		if p.Alive() {
			out = append(out, p)
		}
	}
	return out
}

// Kill sends SIGKILL to the process if it is still the one that was read
// (same pid and start time, checked once a pidfd holds it). It reports
// whether it did.
func (p Proc) Kill() bool {
	return proctest.Kill(p.PID, func(pid int) bool {
		st, ok := proctest.StartTicks(pid)
		return ok && p.StartTicks != 0 && st == p.StartTicks
	})
}
