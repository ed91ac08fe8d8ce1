package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/config"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/gym"
)

type runFlags struct {
	taskFile     string
	task         string
	check        string
	rollout      string
	adapter      string
	harnessBin   string
	modelURL     string
	model        string
	set          []string
	steps        int
	step         time.Duration
	ignoreSIGINT bool
	checkpointAt string
	crashAt      string
	hold         time.Duration
	pause        bool
	stateDir     string
	keep         bool
	ngsupDir     string
	isolation    string
	unsupervised bool
}

func newRunCmd() *cobra.Command {
	c, _ := runCmd()
	return c
}

// runCmd is `ngdriver run` and the flags it fills.
func runCmd() (*cobra.Command, *runFlags) {
	var f runFlags
	c := &cobra.Command{
		Use:   "run [flags]",
		Short: "Run one rollout end to end on local sandboxes",
		Long: `Run one rollout end to end on the embedded default: a local sandbox (a folder
on this machine, seen at /sandbox in a mount namespace of its own) lent by an
embedded local owner, with the fake adapter unless --adapter names another.
The adapter's settings are its section of a serve config, filled from the
flags: --harness-bin its binary, --model-url and --model its model server,
--set any other key. Progress (stage, launch, pause, continue, stop, relaunch)
goes to stderr; the result JSON, with the launch log ng_harness_launches, goes
to stdout.

--checkpoint-at opens a checkpoint at each given time: the run parks (its
harness paused in place, or stopped with --pause=false), the owner snapshots
the sandbox, and the run goes on. --crash-at abandons the run at that time as
if the driver had died, then restores the last committed checkpoint: the owner
forks the snapshot and the run continues from its bookmark in the fork.
--crash-at fires on time, also while a checkpoint holds the run (--hold): that
checkpoint, if it was committed, is never opened and is the one restored.`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("run takes no arguments, got %q", args)
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error { return runRollout(c.Context(), f) },
	}
	fl := c.Flags()
	fl.StringVar(&f.taskFile, "task-file", "", "JSON run body (task, check, files, fake options); flags below fill what it lacks")
	fl.StringVar(&f.task, "task", "count to the end, one step at a time", "the task text given to the harness")
	fl.StringVar(&f.check, "check", "", "shell command the owner runs in the workdir to verify (exit 0 = reward 1); default: every step is in ./progress")
	fl.StringVar(&f.rollout, "rollout-id", "", "the rollout id (default: a new one, run-<time>-<random>, printed in the log)")
	fl.StringVar(&f.adapter, "adapter", "fake", "the harness adapter: "+builtIn().Adapters.Names())
	fl.StringVar(&f.harnessBin, "harness-bin", "", "the harness binary as the sandbox sees it (fills the adapter's binary key: "+binaryKeys()+")")
	fl.StringVar(&f.harnessBin, "opencode", "", "the same as --harness-bin (its name from when opencode was the only harness)")
	fl.StringVar(&f.modelURL, "model-url", "", "the model server's base URL, without /v1 (the adapter's model_url)")
	fl.StringVar(&f.model, "model", "", "the served model's name (the adapter's model; unset: the adapter's own default)")
	fl.StringArrayVar(&f.set, "set", nil, "KEY=VALUE: a key of the adapter's section, VALUE read as YAML (e.g. --set timeout=1h); repeatable, wins over the flags above")
	fl.IntVar(&f.steps, "steps", 12, "fake adapter: steps the harness takes")
	fl.DurationVar(&f.step, "step", 500*time.Millisecond, "fake adapter: time per step")
	fl.BoolVar(&f.ignoreSIGINT, "ignore-sigint", false, "fake adapter: the harness ignores SIGINT")
	fl.StringVar(&f.checkpointAt, "checkpoint-at", "", "open a checkpoint at these times since start (e.g. 3s,8s)")
	fl.StringVar(&f.crashAt, "crash-at", "", "crash the driver at this time and restore the last committed checkpoint")
	fl.DurationVar(&f.hold, "hold", time.Second, "how long each checkpoint holds the run parked")
	fl.BoolVar(&f.pause, "pause", true, "pause the harness in place at checkpoints (false: stop and relaunch)")
	fl.StringVar(&f.stateDir, "state-dir", "", "folder for the local sandboxes and snapshots (default: a new temp folder)")
	fl.BoolVar(&f.keep, "keep", false, "keep the state folder afterwards")
	fl.StringVar(&f.ngsupDir, "ngsup-dir", "", "folder holding ngsup-linux-amd64/arm64 (default: beside ngdriver)")
	fl.StringVar(&f.isolation, "isolation", "auto", "local sandboxes: auto, namespace or none")
	fl.BoolVar(&f.unsupervised, "unsupervised", false, "launch harnesses tagged only, without ngsup run (the fallback path)")
	return c, &f
}

// runSection is the chosen adapter's config section from the flags:
// --harness-bin, --model-url and --model in its common keys, then --set.
func runSection(f runFlags) (map[string]any, error) {
	a, ok := adapters[f.adapter]
	if !ok {
		return nil, usagef("--adapter %q is not built into this ngdriver (it has %s)", f.adapter, builtIn().Adapters.Names())
	}
	sec := map[string]any{}
	if f.harnessBin != "" {
		if a.keys.Binary == "" {
			return nil, usagef("--harness-bin: the %s adapter runs no harness binary", f.adapter)
		}
		sec[a.keys.Binary] = f.harnessBin
	}
	switch {
	case a.keys.Model:
		for key, v := range map[string]string{"model_url": f.modelURL, "model": f.model} {
			if v != "" {
				sec[key] = v
			}
		}
	case f.modelURL != "" || f.model != "":
		return nil, usagef("--model-url, --model: the %s adapter calls no model server", f.adapter)
	}
	for _, kv := range f.set {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, usagef("--set %q: want KEY=VALUE", kv)
		}
		var val any
		if err := yaml.Unmarshal([]byte(v), &val); err != nil {
			return nil, usagef("--set %s: %q is not a YAML value", k, v)
		}
		sec[k] = val
	}
	return sec, nil
}

// parseTimes reads "3s,8s" into sorted durations.
func parseTimes(flag, s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		d, err := time.ParseDuration(part)
		if err != nil || d < 0 {
			return nil, usagef("--%s: %q is not a duration like 3s", flag, part)
		}
		out = append(out, d)
	}
	slices.Sort(out)
	return out, nil
}

// buildBody makes the run body from --task-file and the flags.
func buildBody(f runFlags) (json.RawMessage, error) {
	body := map[string]any{}
	if f.taskFile != "" {
		data, err := os.ReadFile(f.taskFile)
		if err != nil {
			return nil, usagef("--task-file: %v", err)
		}
		if err := json.Unmarshal(data, &body); err != nil {
			return nil, usagef("--task-file %s is not a JSON object: %v", f.taskFile, err)
		}
	}
	setDefault := func(k string, v any) {
		if _, ok := body[k]; !ok {
			body[k] = v
		}
	}
	if f.rollout == "" {
		f.rollout = newRolloutID()
	}
	setDefault("rollout_id", f.rollout)
	setDefault("task", f.task)
	if f.adapter == "fake" {
		if f.check == "" {
			f.check = fmt.Sprintf(`test "$(grep -c '^step' progress)" -ge %d`, f.steps)
		}
		setDefault("fake", map[string]any{"steps": f.steps, "step_s": f.step.Seconds(), "ignore_sigint": f.ignoreSIGINT})
	}
	if f.check != "" {
		setDefault("check", f.check)
	}
	return json.Marshal(body)
}

// newRolloutID names a rollout no other run names: the time and 8 random
// hex digits, so two `ngdriver run` started together never share a rollout
// (nor its launch ids and sandboxes).
func newRolloutID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	// "r" first: an id ending in "-a<digits>" is refused (Gym reserves it).
	return fmt.Sprintf("run-%s-r%s", time.Now().UTC().Format("20060102T150405"), hex.EncodeToString(b[:]))
}

func newLogger(level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.String("time", a.Value.Time().Format("15:04:05.000"))
			}
			return a
		},
	}))
}

func runRollout(ctx context.Context, f runFlags) error {
	section, err := runSection(f)
	if err != nil {
		return err
	}
	adapter, err := buildAdapter(config.Config{Adapter: f.adapter, NgsupDir: f.ngsupDir,
		Sections: map[string]map[string]any{f.adapter: section}})
	if err != nil {
		return err
	}
	checkpoints, err := parseTimes("checkpoint-at", f.checkpointAt)
	if err != nil {
		return err
	}
	crashes, err := parseTimes("crash-at", f.crashAt)
	if err != nil {
		return err
	}
	if len(crashes) > 1 {
		return usagef("--crash-at takes one time")
	}
	body, err := buildBody(f)
	if err != nil {
		return err
	}
	var meta struct {
		RolloutID string `json:"rollout_id"`
	}
	json.Unmarshal(body, &meta)
	if err := driver.ValidateRolloutID(meta.RolloutID); err != nil {
		return usagef("--rollout-id (or the run body's rollout_id): %v", err)
	}
	log := newLogger(slog.LevelInfo)
	log.Info("rollout", "rollout", meta.RolloutID)
	stateDir := f.stateDir
	if stateDir == "" {
		stateDir, err = os.MkdirTemp("", "ngdriver-run-")
		if err != nil {
			return err
		}
	}
	stateDir, _ = filepath.Abs(stateDir)
	if !f.keep && f.stateDir == "" {
		defer os.RemoveAll(stateDir)
	}
	backend, err := local.New(stateDir, local.Options{Isolation: f.isolation})
	if err != nil {
		return err
	}
	release, err := backend.Claim()
	if err != nil {
		return err
	}
	defer release()
	sweep(log, backend)
	binaries := launch.DefaultBinaries(f.ngsupDir)
	if len(binaries) == 0 {
		return fmt.Errorf("no ngsup binary found (looked for ngsup-linux-amd64/arm64 beside ngdriver; build with `make build` or pass --ngsup-dir)")
	}
	ng := &launch.Ngsup{Binaries: binaries, Log: log}
	own := lending.New(lending.Options{
		Backend:     backend,
		StopSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return ng.StopSandbox(ctx, sb) },
		KillSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return ng.StopSandboxGrace(ctx, sb, 0) },
		Logger:      log,
	})
	endUnowned(ctx, own, log)
	pause := f.pause
	checkpointDir := filepath.Join(stateDir, "checkpoints")
	newOwnerControl := func() (*gym.Control, error) {
		return owner.NewControl(own, gym.Config{Instance: "ngdriver_owner", LeaseGrace: driver.DefaultLeaseGrace})
	}
	ownerControl, err := newOwnerControl()
	if err != nil {
		return err
	}
	newRunner := func() *driver.Runner {
		return &driver.Runner{
			Adapter:            adapter,
			Owner:              own,
			Backends:           map[string]sandbox.Backend{backend.Name(): backend},
			Launchers:          ng,
			Participant:        driver.MustParticipant(driver.ParticipantConfig{Adapter: adapter.Name()}),
			Log:                log,
			PauseAtCheckpoints: &pause,
			Unsupervised:       f.unsupervised,
		}
	}
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	type outcome struct {
		result json.RawMessage
		err    error
	}
	start := time.Now()
	attempt := 0
	rn := newRunner()
	runCtx, cancelRun := context.WithCancelCause(ctx)
	done := make(chan outcome, 1)
	launch := func(rn *driver.Runner, runCtx context.Context, attempt int) {
		go func() {
			res, err := rn.Run(runCtx, driver.RunRequest{RolloutID: meta.RolloutID, Attempt: attempt, Body: body})
			done <- outcome{res, err}
		}()
	}
	launch(rn, runCtx, attempt)
	var last *driver.Committed
	type event struct {
		at    time.Duration
		crash bool
	}
	var events []event
	for _, d := range checkpoints {
		events = append(events, event{at: d})
	}
	for _, d := range crashes {
		events = append(events, event{at: d, crash: true})
	}
	slices.SortStableFunc(events, func(a, b event) int { return int(a.at - b.at) })
	// A checkpoint runs beside the loop, so a crash due during its hold
	// fires on time: the checkpoint is left committed and not opened (the
	// run is abandoned parked), and the restore uses it.
	type checkpointed struct {
		c   driver.Committed
		err error
	}
	var ckDone chan checkpointed // non-nil while a checkpoint runs
	var cancelCk context.CancelFunc
	finished := func(r checkpointed, abandoned bool) {
		cancelCk()
		ckDone = nil
		if r.c.ID != "" {
			last = &r.c
		}
		if r.err != nil && !abandoned {
			log.Warn("checkpoint failed", "error", r.err.Error())
		}
	}
	// endCheckpoint waits for the checkpoint in progress, if any; abandon
	// ends it first (it is then never opened).
	endCheckpoint := func(abandon bool) {
		if ckDone == nil {
			return
		}
		if abandon {
			cancelCk()
		}
		finished(<-ckDone, abandon)
	}
	for i := 0; ; {
		var timer <-chan time.Time
		if i < len(events) {
			timer = time.After(time.Until(start.Add(events[i].at)))
		}
		select {
		case out := <-done:
			endCheckpoint(true)
			cancelRun(nil)
			if out.err != nil {
				return fmt.Errorf("rollout %s: %w", meta.RolloutID, out.err)
			}
			os.Stdout.Write(append(indent(out.result), '\n'))
			return nil
		case <-ctx.Done():
			endCheckpoint(true)
			cancelRun(context.Canceled)
			<-done
			return errors.New("interrupted")
		case r := <-ckDone:
			finished(r, false)
		case <-timer:
			ev := events[i]
			i++
			if !ev.crash {
				endCheckpoint(false) // one checkpoint at a time
				id := fmt.Sprintf("ckpt-%d", i)
				ckCtx, cancel := context.WithCancel(ctx)
				cancelCk, ckDone = cancel, make(chan checkpointed, 1)
				go func(p *driver.Participant, ch chan checkpointed) {
					c, err := driver.Checkpoint(ckCtx, []*gym.Control{p.Control(), ownerControl}, filepath.Join(checkpointDir, id), id, f.hold, log)
					ch <- checkpointed{c, err}
				}(rn.Participant, ckDone)
				continue
			}
			endCheckpoint(true)
			log.Warn("crash: the driver is abandoned with nothing cleaned up")
			cancelRun(driver.ErrCrashed)
			<-done
			attempt++
			rn = newRunner()
			if last != nil {
				// The owner lives on (only the driver crashed): a fresh
				// control plane, as a restarted deployment would have.
				if ownerControl, err = newOwnerControl(); err != nil {
					return err
				}
				if err := driver.Restore(ctx, []*gym.Control{rn.Participant.Control(), ownerControl}, *last); err != nil {
					return err
				}
				log.Info("restored", "checkpoint", last.ID, "runs", len(last.Episodes))
			} else {
				log.Info("no checkpoint was committed before the crash: the rollout starts over")
			}
			runCtx, cancelRun = context.WithCancelCause(ctx)
			launch(rn, runCtx, attempt)
		}
	}
}

func indent(data json.RawMessage) []byte {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return data
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return data
	}
	return out
}
