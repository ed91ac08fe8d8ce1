package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Batching: the pauses (and continues) of supervised launches on one host
// are run as one ngsup command. At a checkpoint every run pauses its own
// launch at the same moment; hundreds of ngsup processes started at once
// cost more than the pauses themselves.
const (
	// DefaultBatchWindow is how long a batchable pause or continue waits
	// for others of its host to join its command.
	DefaultBatchWindow = 5 * time.Millisecond
	// DefaultBatchMax bounds the launches of one batched command. ngsup
	// handles 16 at once (reaper.BatchWorkers), so a full batch takes at
	// most four rounds: 20 s if every launch took the 5 s budget, and
	// about ControlTimeout if every one took the 30 s budget of
	// uninterruptible calls (a command that runs out keeps the lines it
	// printed; the launches left fall back to stop, as a pause alone that
	// ran out does). Fewer ngsup processes at a checkpoint is what makes
	// it fast: in the soak (512 launches), 64 a command beat 32.
	DefaultBatchMax = 64
)

// DefaultBatchConcurrency is how many batched commands of one verb run at
// once on one host when Ngsup.BatchConcurrency is 0: the host's CPUs (the
// local backend runs them on the driver's own host). While every slot is
// taken, the launches that arrive wait and join the next command, so a
// loaded host runs fewer, larger batches instead of more at once: in the
// soak (512 launches, 2 CPUs) 31 unbounded commands of up to 64 launches
// ran together, up to 28 processes and 300 workers, and one launch's
// pause took 367 ms in a batch against 1.83 ms alone.
func DefaultBatchConcurrency() int { return max(1, runtime.NumCPU()) }

// batchAnswer is what a batched command said about one launch.
type batchAnswer struct {
	// alone: run the launch's command alone (the batch held only it, or
	// could not be run).
	alone bool
	// line is the launch's line of JSON; nil when the command printed
	// none for it.
	line []byte
	// code is the line's code, or the command's exit code without a line.
	code int
	// stderr is the line's error, or else the last line of the command's
	// stderr, for messages.
	stderr string
	// err: the command's outcome for the launch is unknown (it ran out of
	// its budget before the launch's line, or every caller went away).
	err  error
	took time.Duration
	// release, when set, gives back the command slot held for a launch
	// told to run alone (its command counts against the bound too): the
	// caller calls it once that command has run.
	release func()
}

// batchReq is one launch waiting for a batched command.
type batchReq struct {
	ctx    context.Context
	sb     sandbox.Sandbox
	bin    string // ngsup, as a HostPaths command reaches it
	dir    string // the launch folder, likewise
	answer chan batchAnswer
}

// batchGroup is the requests collected for one command.
type batchGroup struct {
	reqs []*batchReq
	full chan struct{} // closed when the group reached its bound
}

// batcher collects requests by key (verb, host, ngsup build), and bounds
// the commands that run at once by slot key (verb, host).
type batcher struct {
	mu      sync.Mutex
	pending map[string]*batchGroup
	slots   map[string]chan struct{}
}

func (n *Ngsup) batcher() *batcher {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.batches == nil {
		n.batches = &batcher{pending: map[string]*batchGroup{}, slots: map[string]chan struct{}{}}
	}
	return n.batches
}

// slotsLocked returns the semaphore of slot key sk, made with size slots
// the first time. Call with b.mu held.
func (b *batcher) slotsLocked(sk string, size int) chan struct{} {
	sem := b.slots[sk]
	if sem == nil {
		sem = make(chan struct{}, size)
		b.slots[sk] = sem
	}
	return sem
}

// batched runs verb (pause or continue) for a supervised launch of a
// sandbox.HostBatcher in one command with the requests of the same host
// that arrive within BatchWindow (or until BatchMax are queued), through
// the first one's sandbox, and returns the launch's answer. ok is false
// when the launch is not batched (tagged only, no capability, batching
// off) or its command is to be run alone: the batch held only it, or
// could not be run.
func (c control) batched(ctx context.Context, verb string, sb sandbox.Sandbox, bin string, ref Ref) (batchAnswer, bool) {
	n := c.n
	if c.byTag || n.BatchWindow < 0 {
		return batchAnswer{}, false
	}
	hb, ok := sandbox.AsHostBatcher(sb)
	if !ok {
		return batchAnswer{}, false
	}
	hbin, err1 := hb.HostPathOf(bin)
	hdir, err2 := hb.HostPathOf(ref.Dir)
	if err1 != nil || err2 != nil {
		return batchAnswer{}, false
	}
	window, limit, slots := n.BatchWindow, n.BatchMax, n.BatchConcurrency
	if window == 0 {
		window = DefaultBatchWindow
	}
	if limit <= 0 {
		limit = DefaultBatchMax
	}
	if slots <= 0 {
		slots = DefaultBatchConcurrency()
	}
	r := &batchReq{ctx: ctx, sb: sb, bin: hbin, dir: hdir, answer: make(chan batchAnswer, 1)}
	slotKey := verb + "\x00" + hb.BatchKey()
	key := slotKey + "\x00" + path.Base(bin)
	n.batcher().add(key, slotKey, r, window, limit, slots, func(reqs []*batchReq, release func()) { n.runBatch(verb, reqs, release) })
	select {
	case a := <-r.answer:
		return a, !a.alone
	case <-ctx.Done():
		return batchAnswer{code: -1, err: fmt.Errorf("run ngsup %s in %s: %w", verb, sb.ID(), context.Cause(ctx))}, true
	}
}

// add queues r under key; the first request of a group starts its timer.
// When the window ends (or the group holds limit requests) the group waits
// for one of the slots of slotKey, and requests that arrive meanwhile
// still join it (up to limit); it then runs with that slot held. run must
// call release once the slot can be given back. Requests whose callers
// went away before the group ran are left out.
func (b *batcher) add(key, slotKey string, r *batchReq, window time.Duration, limit, slots int, run func(reqs []*batchReq, release func())) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.pending[key]
	if g == nil {
		g = &batchGroup{full: make(chan struct{})}
		b.pending[key] = g
		sem := b.slotsLocked(slotKey, slots)
		go func() {
			t := time.NewTimer(window)
			select {
			case <-t.C:
			case <-g.full:
				t.Stop()
			}
			sem <- struct{}{}
			b.mu.Lock()
			if b.pending[key] == g {
				delete(b.pending, key)
			}
			reqs := make([]*batchReq, 0, len(g.reqs))
			for _, r := range g.reqs {
				if r.ctx.Err() == nil {
					reqs = append(reqs, r)
				}
			}
			b.mu.Unlock()
			var once sync.Once
			release := func() { once.Do(func() { <-sem }) }
			if len(reqs) == 0 {
				release()
				return
			}
			run(reqs, release)
		}()
	}
	g.reqs = append(g.reqs, r)
	if len(g.reqs) >= limit {
		delete(b.pending, key)
		close(g.full)
	}
}

// runBatch runs one command for reqs (several launches; one runs alone, in
// the slot held for it, which its caller gives back) and hands each request
// its line; the slot is given back once the command has run. The command gets ControlTimeout, and is
// cancelled only when every caller has gone. The lines it printed count
// even if it failed; a launch without a line runs alone if the command
// failed, except a pause that ran out of its budget (not run again, as for
// a pause of one launch); if the command ended, a launch without a line is
// answered as by a command that printed nothing.
func (n *Ngsup) runBatch(verb string, reqs []*batchReq, release func()) {
	if len(reqs) == 1 {
		// Its own command runs in the slot taken for it, given back by
		// the caller once it ran, or here if the caller went away.
		stop := context.AfterFunc(reqs[0].ctx, release)
		reqs[0].answer <- batchAnswer{alone: true, release: func() { stop(); release() }}
		return
	}
	defer release()
	ctx, cancel := context.WithCancel(context.WithoutCancel(reqs[0].ctx))
	defer cancel()
	var left atomic.Int64
	left.Store(int64(len(reqs)))
	for _, r := range reqs {
		stop := context.AfterFunc(r.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	argv := []string{reqs[0].bin, verb}
	for _, r := range reqs {
		argv = append(argv, "--dir", r.dir)
	}
	sb := reqs[0].sb
	start := time.Now()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: argv, Timeout: ControlTimeout, HostPaths: true})
	took := time.Since(start)
	type found struct {
		line  []byte
		code  int
		error string
	}
	lines := map[string]found{}
	for _, l := range bytes.Split(res.Stdout, []byte{'\n'}) {
		var head struct {
			Dir   *string `json:"dir"`
			Code  *int    `json:"code"`
			Error string  `json:"error"`
		}
		if l = bytes.TrimSpace(l); len(l) == 0 || json.Unmarshal(l, &head) != nil || head.Dir == nil || head.Code == nil {
			continue
		}
		lines[*head.Dir] = found{line: l, code: *head.Code, error: head.Error}
	}
	// Without its line, a launch runs alone, except when the callers went
	// away or a pause ran out of its budget (as a pause alone that did).
	alone := err != nil && ctx.Err() == nil && (verb != "pause" || !errors.Is(err, sandbox.ErrTimeout))
	if err != nil {
		n.log().Warn("batched ngsup failed", "verb", verb, "launches", len(reqs), "sandbox", sb.ID(),
			"error", err.Error(), "took_ms", took.Milliseconds(), "lines", len(lines), "alone", alone)
	} else {
		n.log().Info("batched ngsup", "verb", verb, "launches", len(reqs), "sandbox", sb.ID(),
			"exit_code", res.ExitCode, "took_ms", took.Milliseconds(), "lines", len(lines))
	}
	for _, r := range reqs {
		a := batchAnswer{alone: alone, code: res.ExitCode, stderr: stderrLine(res), took: took}
		switch f, ok := lines[r.dir]; {
		case ok:
			a.alone, a.line, a.code = false, f.line, f.code
			if f.error != "" {
				a.stderr = f.error
			}
		case err != nil && !alone:
			a.code = -1
			a.err = fmt.Errorf("run ngsup %s (one command for %d launches) in %s: %w", verb, len(reqs), sb.ID(), err)
		}
		r.answer <- a
	}
}
