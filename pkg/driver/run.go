package driver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/harness"
)

// Runner runs rollouts: the stage machine of the seed's
// SandboxedHarnessAgent.
type Runner struct {
	// Adapter is what is harness-specific.
	Adapter harness.Adapter
	// Owner lends the sandboxes.
	Owner owner.Owner
	// Backends connect to sandboxes, by provider name.
	Backends map[string]sandbox.Backend
	// Launchers start and control the launches (a *launch.Ngsup): each
	// launch is started by the supervised launcher, or by the tag-only one
	// when Unsupervised is set or ngsup cannot supervise it, and that
	// launcher controls it to its end.
	Launchers launch.Launchers
	// Participant registers runs for checkpoints.
	Participant *Participant
	// Log receives one line per stage, launch, pause, continue and stop,
	// each naming the rollout and the launch.
	Log *slog.Logger
	// PauseAtCheckpoints overrides the adapter's opt-in when set (false:
	// stop and relaunch at every checkpoint).
	PauseAtCheckpoints *bool
	// Unsupervised launches harnesses tagged only, without ngsup run (the
	// fallback path; tests force it).
	Unsupervised bool
	// StopGrace is the SIGINT-to-SIGKILL grace of a stop (StopGrace if 0).
	StopGrace time.Duration
	// CancelBudget bounds the kill of a cancelled run's launch.
	CancelBudget time.Duration
	// Observer is told about launches, pauses and continues (metrics).
	Observer Observer
	// OwnSandbox makes a sandbox of the driver's own for a run the owner
	// lends none (such a run is a restart). Nil: those runs fail.
	OwnSandbox func(ctx context.Context, rolloutID string) (harness.LentSandbox, error)
}

// RunRequest is one rollout to run (one attempt).
type RunRequest struct {
	// RolloutID names the rollout; a restored record of the same id is
	// continued.
	RolloutID string
	// Attempt is the attempt number (1 for the first).
	Attempt int
	// Body is the run body: the task, as the framework sends it.
	Body json.RawMessage
}

func (rn *Runner) log() *slog.Logger {
	if rn.Log == nil {
		return slog.Default()
	}
	return rn.Log
}

func (rn *Runner) obs() Observer {
	if rn.Observer == nil {
		return nopObserver{}
	}
	return rn.Observer
}

func (rn *Runner) pauses() bool {
	if rn.PauseAtCheckpoints != nil && !*rn.PauseAtCheckpoints {
		return false
	}
	p, ok := rn.Adapter.(harness.PausesAtCheckpoints)
	return ok && p.PausesAtCheckpoints()
}

// attemptState is the run's progress in memory.
type attemptState struct {
	req  RunRequest
	key  string // the attempt's capture key, which names it to the owner
	r    *run
	bm   Bookmark
	log  *slog.Logger
	sb   *harness.LentSandbox // the sandbox of the current launch
	own  *harness.LentSandbox // the driver's own sandbox, when none is lent
	live *liveLaunch          // the launch running or paused now
	gone *launch.Ref          // a paused launch the crash took, until the relaunch says what it does
}

type liveLaunch struct {
	ref    launch.Ref
	l      launch.Launcher // the launcher that started it controls it
	record int             // index in bm.Launches
	begin  time.Time
}

// Run runs one rollout from its bookmark to its result: seed, harness,
// verify, return, recording a bookmark before each step. The result is the
// owner's verify reply plus ng_harness_launches.
func (rn *Runner) Run(ctx context.Context, req RunRequest) (json.RawMessage, error) {
	if err := ValidateRolloutID(req.RolloutID); err != nil {
		return nil, err
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(req.Body, &probe); err != nil {
		return nil, fmt.Errorf("%w: the body is not a JSON object: %v", ErrBadRequest, err)
	}
	if req.Attempt < 0 {
		return nil, fmt.Errorf("%w: attempt %d is negative", ErrBadRequest, req.Attempt)
	}
	id := gym.EpisodeID{RolloutID: req.RolloutID, Attempt: req.Attempt}
	r, err := rn.Participant.register(id, rn.Participant.control.CheckAttempt)
	if err != nil {
		return nil, err
	}
	defer rn.Participant.unregister(r)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rn.Participant.setCancel(r, cancel)
	st := &attemptState{req: req, r: r, bm: r.bookmark.Clone(), key: id.CaptureKey()}
	st.log = rn.log().With("rollout", req.RolloutID, "attempt", req.Attempt)
	if err := st.bm.Validate(); err != nil {
		return nil, fmt.Errorf("continue rollout %s: %w", req.RolloutID, err)
	}
	if st.bm.Next != StageSeed {
		st.log.Info("continuing from bookmark", "next", st.bm.Next, "launches", len(st.bm.Launches))
	}
	if err := rn.Participant.acquire(ctx, r); err != nil {
		return nil, err
	}
	defer rn.Participant.release()
	result, err := rn.stages(ctx, st)
	rn.leave(ctx, st, err)
	return result, err
}

// stages runs the steps from the bookmark on.
func (rn *Runner) stages(ctx context.Context, st *attemptState) (json.RawMessage, error) {
	for {
		if err := context.Cause(ctx); err != nil {
			return nil, err
		}
		switch st.bm.Next {
		case StageSeed:
			st.log.Info("stage", "stage", StageSeed)
			rn.Participant.record(st.r, st.bm, runReplay)
			if err := rn.seed(ctx, st); err != nil {
				return nil, err
			}
		case StageHarness:
			st.log.Info("stage", "stage", StageHarness)
			if err := rn.harness(ctx, st); err != nil {
				return nil, err
			}
		case StageVerify:
			st.log.Info("stage", "stage", StageVerify)
			// Gym's verify modes (steps.py): a checkpoint waits for a verify
			// unless the owner's seed reply said it may be replayed.
			mode := runWaiting
			if st.bm.VerifyMode == VerifyReplay {
				mode = runReplay
			}
			rn.Participant.record(st.r, st.bm, mode)
			if err := rn.verify(ctx, st); err != nil {
				return nil, err
			}
		case StageReturn:
			rn.Participant.record(st.r, st.bm, runReplay)
			if rn.Participant.parking(st.r) {
				// A step that ended while a checkpoint is open parks at
				// its bookmark until the checkpoint opens (Gym's steps):
				// the checkpoint holds the result, not a reply under way.
				st.log.Info("parked before returning")
				if _, err := rn.Participant.park(ctx, st.r, st.bm, nil, nil); err != nil {
					return nil, err
				}
			}
			st.log.Info("stage", "stage", StageReturn)
			return st.bm.Result, nil
		}
	}
}

func (rn *Runner) seed(ctx context.Context, st *attemptState) error {
	reply, err := rn.Owner.SeedSession(ctx, st.key, st.req.Body)
	if err != nil {
		return fmt.Errorf("seed the session of %s: %w", st.req.RolloutID, err)
	}
	next := Bookmark{V: BookmarkVersion, Next: StageHarness, Cookies: reply.Cookies, VerifyMode: reply.VerifyMode, Restart: reply.Restart}
	if reply.Restart {
		// Not while a checkpoint is open: it exports this run at its seed
		// bookmark, and it must stay so until the checkpoint ends.
		if err := rn.Participant.awaitOpen(ctx); err != nil {
			return err
		}
		st.log.Info("the owner cannot capture this session: the run is a restart")
	}
	if acc, ok := reply.HandleAccess(); ok {
		// Kept for an owner without /sandbox_access (it answers 404), as
		// Gym's main-branch SWE-bench server: its seed names the sandbox.
		next.SeedAccess = &acc
	}
	lent, err := rn.connect(ctx, st, next.Cookies, next.SeedAccess)
	if errors.Is(err, owner.ErrNoSandbox) {
		next.Restart = true
		if err := rn.Participant.awaitOpen(ctx); err != nil {
			return err
		}
		st.log.Info("no sandbox is lent: the run is a restart in a sandbox of the driver's own")
		if rn.OwnSandbox == nil {
			return fmt.Errorf("start rollout %s: %w, and this driver has no sandboxes of its own", st.req.RolloutID, err)
		}
		own, oerr := rn.OwnSandbox(ctx, st.req.RolloutID)
		if oerr != nil {
			return fmt.Errorf("make a sandbox for %s: %w", st.req.RolloutID, oerr)
		}
		st.own, lent, err = &own, own, nil
	}
	if err != nil {
		return err
	}
	state, err := rn.Adapter.NewState(st.req.RolloutID, st.req.Attempt, lent)
	if err != nil {
		return fmt.Errorf("make the %s state of %s: %w", rn.Adapter.Name(), st.req.RolloutID, err)
	}
	next.State = state
	next.SandboxHint = lent.ID()
	st.bm = next
	return nil
}

// connect asks the owner which sandbox is current and connects to it. An
// owner that answers /sandbox_access with 404 is taken at the seed reply's
// word (seedAccess), when it named a sandbox. The backend is the one
// provider_config_ref names, else the descriptor's provider, else the only
// backend configured.
func (rn *Runner) connect(ctx context.Context, st *attemptState, c owner.Cookies, seedAccess *owner.Access) (harness.LentSandbox, error) {
	if st.own != nil {
		return *st.own, nil
	}
	acc, err := rn.Owner.SandboxAccess(ctx, st.key, c)
	if errors.Is(err, owner.ErrNoSandbox) && seedAccess != nil {
		acc, err = *seedAccess, nil
	}
	if err != nil {
		return harness.LentSandbox{}, fmt.Errorf("ask the owner for the sandbox of %s: %w", st.req.RolloutID, err)
	}
	d := acc.Connection.Descriptor
	if d.Workdir == "" {
		d.Workdir = acc.Workdir
	}
	name := acc.Connection.ProviderConfigRef
	if name == "" {
		name = d.Provider
	}
	b, ok := rn.Backends[name]
	if !ok && name == "" && len(rn.Backends) == 1 {
		for _, only := range rn.Backends {
			b, ok = only, true
		}
	}
	if !ok {
		return harness.LentSandbox{}, fmt.Errorf("connect to sandbox %s: no backend %q configured", d.SandboxID, name)
	}
	d.Provider = b.Name()
	sb, err := b.Connect(ctx, d)
	if err != nil {
		return harness.LentSandbox{}, fmt.Errorf("connect to sandbox %s: %w", d.SandboxID, err)
	}
	return harness.LentSandbox{Sandbox: sb, Descriptor: d}, nil
}

// harness is the one long wait step: launch, follow, park at checkpoints,
// relaunch after a stop, until the harness has finished.
func (rn *Runner) harness(ctx context.Context, st *attemptState) error {
	// Continued from the bookmark of a checkpoint that paused the launch in
	// place: that launch went with the crash. What the relaunch does is
	// logged once the resume decision is made.
	st.gone = st.bm.Paused
	for {
		// Before every launch: a bookmark; parks here during a checkpoint.
		st.bm.Paused = nil
		rn.Participant.record(st.r, st.bm, runWaiting)
		if rn.Participant.parking(st.r) {
			st.log.Info("parked before launching")
			if _, err := rn.Participant.park(ctx, st.r, st.bm, nil, nil); err != nil {
				return err
			}
			continue
		}
		lent, err := rn.connect(ctx, st, st.bm.Cookies, st.bm.SeedAccess)
		if err != nil {
			return err
		}
		st.sb = &lent
		st.bm.SandboxHint = lent.ID()
		if err := rn.launch(ctx, st); err != nil {
			return err
		}
		done, err := rn.follow(ctx, st)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		// Stopped at a checkpoint: relaunch on the saved session.
	}
}

// launch decides on resuming, uploads ngsup and starts the harness.
func (rn *Runner) launch(ctx context.Context, st *attemptState) error {
	lent := *st.sb
	rec := LaunchRecord{SandboxID: lent.ID(), Outcome: OutcomeRunning, ExitCode: -1, StartedAt: time.Now().UTC()}
	if st.bm.Resume {
		d, err := rn.Adapter.ResumeDecision(ctx, lent, st.bm.State, st.req.RolloutID, st.req.Attempt)
		if err != nil {
			return fmt.Errorf("decide whether %s can resume: %w", st.req.RolloutID, err)
		}
		rec.Resumed, rec.Reason = d.Resume, d.Reason
		if !d.Resume && d.State != nil {
			st.bm.State = d.State
		}
		st.bm.Resume = d.Resume
	} else {
		rec.Reason = "first launch"
		if len(st.bm.Launches) > 0 {
			rec.Reason = "no saved session to continue"
		}
	}
	if gone := st.gone; gone != nil {
		st.gone = nil
		if rec.Resumed {
			st.log.Info("the paused launch is gone; relaunching on its saved session", "launch", gone.ID, "reason", rec.Reason)
		} else {
			st.log.Info("the paused launch is gone; its saved session cannot be continued, starting over", "launch", gone.ID, "reason", rec.Reason)
		}
	}
	n := len(st.bm.Launches) + 1
	rec.ID = LaunchID(st.req.RolloutID, st.req.Attempt, n, lent.ID())
	ref := launch.Ref{ID: rec.ID, Dir: path.Join(lent.Root(), "launches", rec.ID), SandboxID: lent.ID()}
	l := rn.Launchers.Launcher(!rn.Unsupervised)
	if err := l.Prepare(ctx, lent); err != nil {
		return err
	}
	spec, err := rn.Adapter.Launch(ctx, harness.LaunchContext{
		RolloutID: st.req.RolloutID, Attempt: st.req.Attempt, Input: st.req.Body,
		Sandbox: lent, State: st.bm.State, Resume: st.bm.Resume, LaunchID: ref.ID, LaunchDir: ref.Dir,
	})
	if err != nil {
		return fmt.Errorf("prepare the %s launch of %s: %w", rn.Adapter.Name(), st.req.RolloutID, err)
	}
	if spec.Dir == "" {
		spec.Dir = lent.Workdir()
	}
	err = l.Start(ctx, lent, ref, spec)
	if errors.Is(err, launch.ErrNoSupervisor) {
		// Launch tagged only, found by its tag for pause, continue and
		// stop from now on.
		st.log.Warn("ngsup could not supervise the launch; running it unsupervised", "launch", ref.ID, "error", err.Error())
		l = rn.Launchers.Launcher(false)
		err = l.Start(ctx, lent, ref, spec)
	}
	ref.Supervised, rec.Supervised = l.Supervised(), l.Supervised()
	if err != nil {
		rec.Outcome, rec.Error = OutcomeFailed, err.Error()
		st.bm.Launches = append(st.bm.Launches, rec)
		return err
	}
	st.bm.Launches = append(st.bm.Launches, rec)
	if len(st.bm.Launches) > 1 {
		rn.obs().Relaunched(rec.Resumed)
	}
	st.live = &liveLaunch{ref: ref, l: l, record: len(st.bm.Launches) - 1, begin: time.Now()}
	st.log.Info("launched", "launch", ref.ID, "sandbox", lent.ID(), "resumed", rec.Resumed, "reason", rec.Reason, "supervised", ref.Supervised)
	return nil
}

// launchPrefixLen bounds the readable part of a launch id.
const launchPrefixLen = 64

// LaunchID names launch n of an attempt of a rollout in the sandbox
// sandboxID, in ngsup's id alphabet and length: a readable prefix (the
// rollout id with every character outside [A-Za-z0-9._-] made '_', cut to
// 64 bytes, then -a<attempt>-l<n>) and 12 hex digits of the SHA-256 of the
// exact rollout id, attempt, launch number and sandbox id. Two launches
// that differ in any of the four get different ids even when their
// prefixes are the same ("dup:1" and "dup/1", or ids sharing their first
// 64 bytes). The sandbox id is in the hash because a launch id is also the
// tag a stop scans processes for: two deployments on one host (the local
// backend, no PID namespaces) running rollouts of the same id, as Gym's
// "<task>-<rollout>" ids are from job to job, must never share one.
func LaunchID(rollout string, attempt, n int, sandboxID string) string {
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, rollout)
	clean = strings.TrimLeft(clean, ".")
	if len(clean) > launchPrefixLen {
		clean = clean[:launchPrefixLen]
	}
	if clean == "" {
		clean = "launch"
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%d\x00%d\x00%d\x00%s%s", attempt, n, len(sandboxID), sandboxID, rollout)))
	return fmt.Sprintf("%s-a%d-l%d-%s", clean, attempt, n, hex.EncodeToString(sum[:6]))
}

// follow waits on the live launch with short `ngsup wait` calls, parks at
// checkpoints (pause in place, or stop), and returns done when the harness
// has ended and the response is collected.
func (rn *Runner) follow(ctx context.Context, st *attemptState) (done bool, err error) {
	lv := st.live
	keepResult := false // the launch ended before a park: no more parks
	for {
		parkCh := rn.Participant.parkRequested(st.r)
		if keepResult {
			parkCh = nil
		}
		waitCtx, cancelWait := context.WithCancel(ctx)
		type waited struct {
			ended    bool
			exitCode int
			err      error
		}
		ch := make(chan waited, 1)
		go func() {
			r, ended, err := lv.l.Wait(waitCtx, st.sb, lv.ref, launch.WaitChunk)
			w := waited{ended: ended, err: err}
			if r != nil {
				w.exitCode = r.ExitCode
			}
			ch <- w
		}()
		select {
		case w := <-ch:
			cancelWait()
			if w.err != nil {
				return false, rn.failLaunch(st, fmt.Errorf("follow launch %s: %w", lv.ref.ID, w.err))
			}
			if w.ended {
				return true, rn.finished(ctx, st, w.exitCode)
			}
		case <-parkCh:
			// The pause does not wait for the cancelled `ngsup wait` to be
			// killed and reaped: at a checkpoint hundreds of them end at
			// once, which took a median 0.8 s (up to 3.4 s) of the soak's
			// prepare at 512 runs before the first pause could start. A
			// wait only reads the launch folder, and its answer is not
			// used (a launch that ended meanwhile is the pause's "ended").
			cancelWait()
			relaunch, ended, err := rn.parkLaunch(ctx, st)
			<-ch
			if err != nil {
				return false, err
			}
			if relaunch {
				return false, nil
			}
			keepResult = ended
		case <-ctx.Done():
			cancelWait()
			<-ch
			return false, context.Cause(ctx)
		}
	}
}

// finished records the end of the live launch and collects the response.
func (rn *Runner) finished(ctx context.Context, st *attemptState, exitCode int) error {
	lv := st.live
	rec := &st.bm.Launches[lv.record]
	rec.DurationS = time.Since(lv.begin).Seconds()
	rec.ExitCode = exitCode
	rec.Outcome = OutcomeFinished
	if exitCode != 0 {
		rec.Outcome = OutcomeFailed
		rec.Error = fmt.Sprintf("the harness exited %d", exitCode)
	}
	st.log.Info("launch ended", "launch", lv.ref.ID, "exit_code", exitCode, "outcome", rec.Outcome)
	rn.obs().LaunchEnded(rec.Outcome)
	stdout, stderr, err := lv.l.Output(ctx, st.sb, lv.ref)
	if err != nil {
		return err
	}
	resp, err := rn.Adapter.Response(ctx, *st.sb, st.bm.State, harness.HarnessResult{ExitCode: exitCode, Stdout: stdout, Stderr: stderr})
	if err != nil {
		return fmt.Errorf("collect the response of %s: %w", st.req.RolloutID, err)
	}
	st.live = nil
	st.bm.Next = StageVerify
	st.bm.Response = resp
	st.bm.Resume = false
	st.bm.Paused = nil
	return nil
}

func (rn *Runner) failLaunch(st *attemptState, err error) error {
	if st.live != nil {
		rec := &st.bm.Launches[st.live.record]
		rec.Outcome, rec.Error = OutcomeFailed, err.Error()
		rec.DurationS = time.Since(st.live.begin).Seconds()
		rn.obs().LaunchEnded(OutcomeFailed)
	}
	return err
}

// parkLaunch parks the run at a checkpoint with its launch paused in place
// (continued on open), or stopped (relaunched on open). A launch that ended
// before the park keeps its result: nothing is paused, the wait goes on and
// returns at once. It reports whether the run must relaunch, and whether the
// launch had ended.
func (rn *Runner) parkLaunch(ctx context.Context, st *attemptState) (relaunch, ended bool, err error) {
	lv := st.live
	rec := &st.bm.Launches[lv.record]
	if rn.pauses() {
		if !lv.l.Supervised() && !rn.Unsupervised {
			st.log.Warn("pausing a launch that should be supervised but is not: its processes are found by their tag", "launch", lv.ref.ID)
		}
		out := lv.l.Pause(ctx, st.sb, lv.ref, st.req.RolloutID)
		if err := context.Cause(ctx); err != nil {
			return false, false, err // cancelled or crashed meanwhile
		}
		rn.obs().Paused(out.Elapsed, out.Paused(), out.Cause())
		switch {
		case out.Ended():
			st.log.Info("the launch had already ended; keeping its result", "launch", lv.ref.ID)
			return false, true, nil
		case out.Paused():
			pausedAt := time.Now()
			rec.Pauses++
			// elapsed_ms is ngsup's time for this launch; took_ms the
			// driver's, from the pause's request (the soak reads both).
			st.log.Info("paused", "launch", lv.ref.ID, "processes", out.Result.Processes,
				"elapsed_ms", out.Result.ElapsedMS, "took_ms", out.Elapsed.Milliseconds(), "method", out.Result.Method, "pauses", rec.Pauses)
			bm := st.bm.Clone()
			bm.Resume = true
			ref := lv.ref
			bm.Paused = &ref
			bm.Launches[lv.record].Outcome = OutcomeInterrupted
			bm.Launches[lv.record].DurationS = time.Since(lv.begin).Seconds()
			bm.Launches[lv.record].Error = "paused at a checkpoint; gone if the driver crashed"
			stopper := func(ctx context.Context) error {
				_, err := lv.l.Stop(ctx, st.sb, lv.ref, rn.grace())
				return err
			}
			killed, err := rn.Participant.park(ctx, st.r, bm, &ref, stopper)
			if err != nil {
				return false, false, err
			}
			if killed {
				rec.PausedS += time.Since(pausedAt).Seconds()
				st.log.Info("the paused launch was stopped by the commit; relaunching", "launch", lv.ref.ID)
				rn.interrupted(st, "stopped at a checkpoint commit")
				return true, false, nil
			}
			began := time.Now()
			res, err := lv.l.Continue(ctx, st.sb, lv.ref)
			rec.PausedS += time.Since(pausedAt).Seconds()
			if cerr := context.Cause(ctx); cerr != nil {
				return false, false, cerr // cancelled or crashed meanwhile
			}
			cause := ""
			switch {
			case err != nil:
				cause = "failed"
			case out.Result.Processes > 0 && res.Continued == 0 && res.Found == 0 && !rn.endedWell(ctx, st):
				// Nothing the pause held is left to continue, nothing of
				// the launch runs (a continue sent again after a lost reply
				// finds it running), and the harness did not finish:
				// something killed the launch while it was paused.
				// Following it would take its end for the harness's.
				cause = "found_nothing"
				err = fmt.Errorf("the continue found none of the %d processes its pause held (%d gone)", out.Result.Processes, res.Skipped)
			}
			rn.obs().Continued(time.Since(began), err == nil, cause)
			if err == nil {
				st.log.Info("continued", "launch", lv.ref.ID, "processes", res.Continued, "gone", res.Skipped, "elapsed_ms", res.ElapsedMS)
				return false, false, nil
			}
			st.log.Warn("the paused launch could not be continued; stopping it and relaunching", "launch", lv.ref.ID, "error", err.Error())
			return true, false, rn.stopAndRelaunch(ctx, st, "could not be continued: "+err.Error(), false)
		default:
			st.log.Warn("pause not confirmed; falling back to stop", "launch", lv.ref.ID, "error", errText(out.Err), "exit_code", out.Code)
			return true, false, rn.stopAndRelaunch(ctx, st, "pause not confirmed: "+errText(out.Err), true)
		}
	}
	return true, false, rn.stopAndRelaunch(ctx, st, "stopped at a checkpoint", true)
}

// endedWell reports whether the live launch's receipt says its harness
// ended by itself with exit code 0 (it finished as the pause came: its
// result is kept). A launch that runs tagged only has no receipt.
func (rn *Runner) endedWell(ctx context.Context, st *attemptState) bool {
	lv := st.live
	r, err := lv.l.Status(ctx, st.sb, lv.ref)
	return err == nil && r.Ended && r.ExitCode == 0 && r.Signal == 0
}

func errText(err error) string {
	if err == nil {
		return "no reason given"
	}
	return err.Error()
}

func (rn *Runner) grace() time.Duration {
	if rn.StopGrace > 0 {
		return rn.StopGrace
	}
	return launch.StopGrace
}

// stopAndRelaunch stops the live launch, records it interrupted, and (when
// park is set, i.e. at a checkpoint) parks the run at a bookmark that
// relaunches on the saved session. A launch that ended meanwhile keeps its
// result: the caller's wait returns it.
func (rn *Runner) stopAndRelaunch(ctx context.Context, st *attemptState, why string, park bool) error {
	lv := st.live
	res, err := lv.l.Stop(ctx, st.sb, lv.ref, rn.grace())
	if err != nil {
		return fmt.Errorf("stop launch %s: %w", lv.ref.ID, err)
	}
	st.log.Info("stopped", "launch", lv.ref.ID, "interrupted", res.Interrupted, "killed", res.Killed, "elapsed_ms", res.ElapsedMS, "why", why)
	rn.interrupted(st, why)
	if !park {
		return nil
	}
	rn.Participant.record(st.r, st.bm, runWaiting)
	_, err = rn.Participant.park(ctx, st.r, st.bm, nil, nil)
	return err
}

// interrupted records the live launch as interrupted and sets the bookmark
// to relaunch on the saved session.
func (rn *Runner) interrupted(st *attemptState, why string) {
	lv := st.live
	rec := &st.bm.Launches[lv.record]
	rec.Outcome = OutcomeInterrupted
	rec.Error = why
	rn.obs().LaunchEnded(OutcomeInterrupted)
	rec.DurationS = time.Since(lv.begin).Seconds()
	st.bm.Resume = true
	st.bm.Paused = nil
	st.live = nil
}

func (rn *Runner) verify(ctx context.Context, st *attemptState) error {
	var body map[string]json.RawMessage
	if err := json.Unmarshal(st.req.Body, &body); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	response := st.bm.Response
	var fields map[string]json.RawMessage
	if g, ok := rn.Adapter.(harness.GymResulter); ok {
		var err error
		if response, fields, err = g.GymResult(st.bm.Response, st.req.Body); err != nil {
			return fmt.Errorf("build the response of %s: %w", st.req.RolloutID, err)
		}
	}
	body["response"] = response
	data, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("build the verify request of %s: %w", st.req.RolloutID, err)
	}
	reply, err := rn.Owner.Verify(ctx, st.key, st.bm.Cookies, data)
	if err != nil {
		return fmt.Errorf("verify %s: %w", st.req.RolloutID, err)
	}
	st.log.Info("verified", "reward", reply.Reward, "failure_kind", reply.FailureKind)
	var result map[string]json.RawMessage
	if err := json.Unmarshal(reply.Body, &result); err != nil || result == nil {
		result = map[string]json.RawMessage{}
		for k, v := range body {
			result[k] = v
		}
		result["reward"], _ = json.Marshal(reply.Reward)
	}
	if _, ok := result["response"]; !ok {
		result["response"] = response
	}
	for k, v := range fields {
		result[k] = v
	}
	launches := st.bm.Launches
	if launches == nil {
		launches = []LaunchRecord{}
	}
	result["ng_harness_launches"], _ = json.Marshal(launches)
	out, err := json.Marshal(result)
	if err != nil {
		return fmt.Errorf("build the result of %s: %w", st.req.RolloutID, err)
	}
	st.bm.Next = StageReturn
	st.bm.Result = out
	return nil
}

// leave applies the seed's table "Leaving the sandbox" once the run ends.
func (rn *Runner) leave(ctx context.Context, st *attemptState, runErr error) {
	cause := context.Cause(ctx)
	if errors.Is(runErr, ErrCrashed) || errors.Is(cause, ErrCrashed) {
		return // a crash cleans nothing up
	}
	if errors.Is(cause, ErrShuttingDown) && runErr != nil {
		return // parked or not, the checkpoint holds the run
	}
	verified := runErr == nil
	// Shielded from the cancellation and time-limited.
	budget := rn.CancelBudget
	if budget <= 0 {
		budget = rn.grace() + 30*time.Second
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	defer cancel()
	if !verified && st.live != nil {
		lv := st.live
		res, err := lv.l.Stop(cctx, st.sb, lv.ref, min(rn.grace(), 2*time.Second))
		if err != nil {
			st.log.Warn("could not kill the launch of a failed run", "launch", lv.ref.ID, "error", err.Error())
		} else {
			st.log.Info("killed the launch of a failed run", "launch", lv.ref.ID, "killed", res.Killed)
		}
		rn.failLaunch(st, runErr)
	}
	checkpointed := !st.bm.Restart
	switch {
	case checkpointed && verified:
		// The owner ended the session.
	case checkpointed:
		if len(st.bm.Cookies) > 0 {
			if err := rn.Owner.CloseSession(cctx, st.key, st.bm.Cookies); err != nil {
				st.log.Warn("could not close the session", "error", err.Error())
			}
		}
	case st.sb != nil:
		if err := rn.Launchers.StopSandbox(cctx, st.sb.Sandbox); err != nil {
			st.log.Warn("could not stop the sandbox of a restart run", "sandbox", st.sb.ID(), "error", err.Error())
		}
	}
}
