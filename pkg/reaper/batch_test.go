package reaper

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestEach proves that Each runs every index once, never more than workers
// at once, and emits in index order even when later indexes finish first
// (index 0 is held until the indexes that fit in the other workers have
// run).
func TestEach(t *testing.T) {
	for _, tc := range []struct{ n, workers int }{{0, 4}, {1, 8}, {5, 1}, {20, 4}, {3, 10}} {
		var mu sync.Mutex
		running, most := 0, 0
		ran := make([]int, tc.n)
		release := make(chan struct{})
		var emitted []int
		Each(tc.n, tc.workers, func(i int) {
			mu.Lock()
			running++
			most = max(most, running)
			ran[i]++
			mu.Unlock()
			if i == 0 {
				// Hold the first until the others that fit have started:
				// they finish before it, and must still be emitted after.
				for k := 1; k < min(tc.workers, tc.n); k++ {
					<-release
				}
			} else if i < tc.workers {
				release <- struct{}{}
			}
			mu.Lock()
			running--
			mu.Unlock()
		}, func(i int) { emitted = append(emitted, i) })
		want := make([]int, tc.n)
		for i := range want {
			want[i] = i
		}
		if !slices.Equal(emitted, want) {
			t.Errorf("n=%d workers=%d: emitted %v, want %v", tc.n, tc.workers, emitted, want)
		}
		for i, c := range ran {
			if c != 1 {
				t.Errorf("n=%d workers=%d: index %d ran %d times", tc.n, tc.workers, i, c)
			}
		}
		if most > tc.workers {
			t.Errorf("n=%d workers=%d: %d ran at once", tc.n, tc.workers, most)
		}
	}
}

// TestPauseAllBeginsEveryPauseFirst proves PauseAll's order with a single
// worker: every launch's pause is begun (SIGSTOP to its harness's group)
// before the first is confirmed; paused one after another, the second
// would begin only after the first was confirmed. Each launch is then held
// and continues as Pause alone leaves it.
func TestPauseAllBeginsEveryPauseFirst(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the launches' supervisors need root (cgroups)")
	}
	tree := benchTree{name: "flat3", script: flatScript, arg: "3", processes: 4}
	var launches []*benchLaunch
	var dirs []string
	for range 3 {
		bl := startBenchLaunch(t, tree)
		launches, dirs = append(launches, bl), append(dirs, bl.dir)
	}
	var mu sync.Mutex
	var events []string
	pauseTrace = func(event, dir string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, event+" "+filepath.Base(filepath.Dir(dir)))
	}
	defer func() { pauseTrace = nil }()
	var codes []int
	PauseAll(dirs, PauseOptions{}, 1, func(i int, res proto.PauseResult, code int, err error) {
		if err != nil || !res.Paused || res.Processes != tree.processes {
			t.Errorf("launch %d: code %d, %v, %+v", i, code, err, res)
		}
		codes = append(codes, code)
	})
	if !slices.Equal(codes, []int{0, 0, 0}) {
		t.Fatalf("codes %v, want three 0 in order", codes)
	}
	mu.Lock()
	got := slices.Clone(events)
	mu.Unlock()
	kinds := make([]string, len(got))
	for i, e := range got {
		kinds[i], _, _ = strings.Cut(e, " ")
	}
	if want := []string{"begun", "begun", "begun", "confirmed", "confirmed", "confirmed"}; !slices.Equal(kinds, want) {
		t.Errorf("the pauses went %v, want every one begun first", got)
	}
	for _, bl := range launches {
		n := 0
		for _, p := range bl.tagged() {
			if p.PID == bl.sup.PID {
				continue
			}
			n++
			if held, why := proctest.Held(p.PID, p.StartTicks); !held {
				t.Errorf("%s: process %d not held while paused: %s", bl.id, p.PID, why)
			}
		}
		if n != tree.processes {
			t.Errorf("%s: %d processes of the launch found, want %d", bl.id, n, tree.processes)
		}
		if _, code, err := Continue(bl.dir); err != nil || code != proto.ExitOK {
			t.Errorf("continue %s: code %d, %v", bl.dir, code, err)
		}
	}
}
