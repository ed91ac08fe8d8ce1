package reaper

import (
	"slices"
	"sync"
	"testing"
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
