package reaper

import "sync"

// BatchWorkers is how many launch folders a pause or continue given several
// of them (`ngsup pause --dir A --dir B ...`) handles at once. Each launch
// is still handled on its own lock, exactly as when it is named alone. A
// pause mostly waits for its processes to stop, so a launch that takes its
// whole budget (5 s, 30 s while only processes in an uninterruptible call
// are left) holds a worker that long (the driver's batches of at most 64
// launches take at most four rounds).
const BatchWorkers = 16

// Each runs do(i) for every i in [0, n), at most workers at once, and calls
// emit(i) on the caller's goroutine in the order 0, 1, ..., n-1, each as
// soon as do(i) and every do before it have returned: the first results are
// handed on while later ones still run.
func Each(n, workers int, do func(i int), emit func(i int)) {
	if n <= 0 {
		return
	}
	workers = max(1, min(workers, n))
	done := make([]chan struct{}, n)
	for i := range done {
		done[i] = make(chan struct{})
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				do(i)
				close(done[i])
			}
		}()
	}
	go func() {
		for i := 0; i < n; i++ {
			next <- i
		}
		close(next)
	}()
	for i := 0; i < n; i++ {
		<-done[i]
		emit(i)
	}
	wg.Wait()
}
