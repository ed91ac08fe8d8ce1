package execd

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/proctest"
)

// A snapshot on the real server's Docker runtime commits the container
// with it paused: every process of the sandbox, execd included, stands
// still until the commit is done. The fake does the same for real: each
// process of the sandbox gets SIGSTOP (held by a pidfd, so a pid reused
// since is never signalled) and SIGCONT at the thaw; one that was stopped
// already (a launch ngsup paused, a command that stopped itself) is left
// as it was, as the freezer leaves it. execd runs inside this process, so
// it is frozen by a gate instead: no request is answered and no event is
// written until the thaw (see execd.waitThawed).

// frozen is one freeze of a sandbox.
type frozen struct {
	fds   []int // pidfds of the processes this freeze stopped
	start time.Time
}

// freezeProcs stops every running process of the sandbox, in a few rounds
// so that a process started while the first round ran is caught too.
func freezeProcs(hostFolder, mountPoint string) *frozen {
	fz := &frozen{start: time.Now()}
	host, err := os.Stat(hostFolder)
	if err != nil {
		return fz
	}
	seen := map[int]bool{}
	for round := 0; round < 3; round++ {
		for _, pid := range procsIn(host, mountPoint) {
			if seen[pid] {
				continue
			}
			seen[pid] = true
			switch proctest.State(pid) {
			case 0, 'T', 't':
				continue // gone, or stopped by someone else: left as it is
			}
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue
			}
			if !inSandbox(pid, host, mountPoint) || unix.PidfdSendSignal(fd, unix.SIGSTOP, nil, 0) != nil {
				unix.Close(fd)
				continue
			}
			fz.fds = append(fz.fds, fd)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fz
}

// thaw continues the processes the freeze stopped and says how long it
// held them.
func (fz *frozen) thaw() time.Duration {
	for _, fd := range fz.fds {
		_ = unix.PidfdSendSignal(fd, unix.SIGCONT, nil, 0)
		unix.Close(fd)
	}
	fz.fds = nil
	return time.Since(fz.start)
}

// snapshotQueue is the server's capacity for snapshots: up to capacity of
// them progress at full speed, and beyond that they share it equally, so
// n snapshots at once each take about n/capacity times as long as one
// alone, as the real server's took (0.5 - 2.4 s for one, 5.8 - 14.7 s
// each for 8 at once).
type snapshotQueue struct {
	capacity int
	quit     <-chan struct{}

	mu   sync.Mutex
	jobs map[*snapshotJob]struct{}
	wake chan struct{}
	run  bool
}

type snapshotJob struct {
	left time.Duration
	done chan struct{}
}

func newSnapshotQueue(capacity int, quit <-chan struct{}) *snapshotQueue {
	return &snapshotQueue{capacity: capacity, quit: quit, jobs: map[*snapshotJob]struct{}{}, wake: make(chan struct{}, 1)}
}

// work returns once work's worth of the server's snapshot capacity went to
// this snapshot (or the server closed).
func (q *snapshotQueue) work(work time.Duration, wg *sync.WaitGroup) {
	if work <= 0 {
		return
	}
	j := &snapshotJob{left: work, done: make(chan struct{})}
	q.mu.Lock()
	q.jobs[j] = struct{}{}
	if !q.run {
		q.run = true
		wg.Add(1)
		go q.loop(wg)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	select {
	case <-j.done:
	case <-q.quit:
	}
}

// loop hands out the capacity every few milliseconds until no snapshot is
// left.
func (q *snapshotQueue) loop(wg *sync.WaitGroup) {
	defer wg.Done()
	const tick = 5 * time.Millisecond
	last := time.Now()
	for {
		q.mu.Lock()
		if len(q.jobs) == 0 {
			q.run = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		select {
		case <-q.quit:
			return
		case <-time.After(tick):
		case <-q.wake:
		}
		now := time.Now()
		elapsed := now.Sub(last)
		last = now
		q.mu.Lock()
		n := len(q.jobs)
		share := elapsed
		if n > q.capacity {
			share = elapsed * time.Duration(q.capacity) / time.Duration(n)
		}
		for j := range q.jobs {
			j.left -= share
			if j.left <= 0 {
				close(j.done)
				delete(q.jobs, j)
			}
		}
		q.mu.Unlock()
	}
}
