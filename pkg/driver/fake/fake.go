// Package fake is the fake adapter: a scripted harness (harness.sh) that
// forks, detaches a daemon, writes files, and can be told to ignore SIGINT.
// It is the second user of the driver, and drives most of its tests and the
// demo. Each step of the script stands for a model turn and is recorded in
// the saved session, so a relaunch continues after the last one. Its /run
// reply carries a NeMoGymResponse built from that session, one assistant
// message a step, as every adapter's does (gymresponse.go).
package fake

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
)

//go:embed harness.sh
var script []byte

// Options is the fake harness's default behaviour; a task may override it
// with a "fake" object of the same fields.
type Options struct {
	Steps       int     `json:"steps"`
	StepSeconds float64 `json:"step_s"`
	InstallS    float64 `json:"install_s"`
	// InstallUntil, when set, makes the install last until a file of that
	// name exists in the workdir (after InstallS, if both are set).
	InstallUntil string `json:"install_until,omitempty"`
	IgnoreSIGINT bool   `json:"ignore_sigint"`
	Child        *bool  `json:"child,omitempty"`
	OwnSession   *bool  `json:"own_session,omitempty"`
	Daemon       *bool  `json:"daemon,omitempty"`
	Untagged     *bool  `json:"untagged,omitempty"`
	ExitCode     int    `json:"exit_code"`
}

// Adapter is the fake adapter.
type Adapter struct {
	// Defaults apply where a task says nothing.
	Defaults Options
	// Pause opts in to pausing at checkpoints.
	Pause bool
}

// State is where the fake harness keeps its session.
type State struct {
	SessionDir string `json:"session_dir"`
}

// Name implements harness.Adapter.
func (a *Adapter) Name() string { return "fake" }

// PausesAtCheckpoints implements harness.PausesAtCheckpoints.
func (a *Adapter) PausesAtCheckpoints() bool { return a.Pause }

func sessionDir(sb harness.LentSandbox, rollout string, attempt, n int) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, rollout)
	return path.Join(sb.Root(), "state", "fake", fmt.Sprintf("%s-a%d-%d", clean, attempt, n))
}

// NewState implements harness.Adapter.
func (a *Adapter) NewState(rollout string, attempt int, sb harness.LentSandbox) (json.RawMessage, error) {
	return json.Marshal(State{SessionDir: sessionDir(sb, rollout, attempt, time.Now().Nanosecond())})
}

func parseState(raw json.RawMessage) (State, error) {
	var s State
	if err := json.Unmarshal(raw, &s); err != nil || s.SessionDir == "" || !path.IsAbs(s.SessionDir) {
		return s, fmt.Errorf("the fake adapter's state %s names no absolute session folder", raw)
	}
	return s, nil
}

// ResumeDecision implements harness.Adapter: a saved session can be continued
// when it holds at least one completed step.
func (a *Adapter) ResumeDecision(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, rollout string, attempt int) (harness.Decision, error) {
	st, err := parseState(raw)
	if err != nil {
		return harness.Decision{}, err
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", path.Join(st.SessionDir, StepsFile)}, Timeout: 30 * time.Second})
	if err != nil {
		return harness.Decision{}, fmt.Errorf("read the saved session: %w", err)
	}
	steps := 0
	if res.ExitCode == 0 {
		steps = strings.Count(string(res.Stdout), "\n")
	}
	if steps > 0 {
		return harness.Decision{Resume: true, Reason: fmt.Sprintf("the saved session holds %d completed steps", steps)}, nil
	}
	fresh, _ := json.Marshal(State{SessionDir: sessionDir(sb, rollout, attempt, time.Now().Nanosecond())})
	return harness.Decision{Resume: false, Reason: "the saved session holds no completed step; starting over", State: fresh}, nil
}

// task is the part of a run body the fake adapter reads.
type task struct {
	Task string          `json:"task"`
	Fake json.RawMessage `json:"fake"`
}

// Launch implements harness.Adapter: it uploads the script and runs it.
func (a *Adapter) Launch(ctx context.Context, lc harness.LaunchContext) (harness.LaunchSpec, error) {
	st, err := parseState(lc.State)
	if err != nil {
		return harness.LaunchSpec{}, err
	}
	var t task
	if err := json.Unmarshal(lc.Input, &t); err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("read the task: %w", err)
	}
	opt := a.Defaults
	if len(t.Fake) > 0 {
		if err := json.Unmarshal(t.Fake, &opt); err != nil {
			return harness.LaunchSpec{}, fmt.Errorf("read the task's fake options: %w", err)
		}
	}
	if opt.Steps <= 0 {
		opt.Steps = 6
	}
	if opt.StepSeconds <= 0 {
		opt.StepSeconds = 0.5
	}
	bin := path.Join(lc.Sandbox.Root(), "bin", "fake-harness.sh")
	if err := lc.Sandbox.Upload(ctx, bin, script, 0o755); err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("upload the fake harness: %w", err)
	}
	flag := func(p *bool) string {
		if p == nil || *p {
			return "1"
		}
		return "0"
	}
	env := map[string]string{
		"FAKE_STEPS":         strconv.Itoa(opt.Steps),
		"FAKE_STEP_S":        strconv.FormatFloat(opt.StepSeconds, 'f', -1, 64),
		"FAKE_INSTALL_S":     strconv.FormatFloat(opt.InstallS, 'f', -1, 64),
		"FAKE_INSTALL_UNTIL": opt.InstallUntil,
		"FAKE_IGNORE_SIGINT": map[bool]string{true: "1", false: "0"}[opt.IgnoreSIGINT],
		"FAKE_CHILD":         flag(opt.Child),
		"FAKE_OWN_SESSION":   flag(opt.OwnSession),
		"FAKE_DAEMON":        flag(opt.Daemon),
		"FAKE_UNTAGGED":      flag(opt.Untagged),
		"FAKE_EXIT_CODE":     strconv.Itoa(opt.ExitCode),
	}
	argv := []string{"/bin/sh", bin, st.SessionDir, lc.Sandbox.Workdir()}
	if t.Task != "" {
		argv = append(argv, t.Task)
	}
	return harness.LaunchSpec{Argv: argv, Env: env}, nil
}

// Response implements harness.Adapter: what GymResult builds the run's
// NeMoGymResponse from, as a harness.StoredRun: the harness's exit code, its
// saved session (the steps file, each step a JSON string; null when it
// could not be read), and the tails of its stdout (its last line is the
// harness's summary, Output) and stderr.
func (a *Adapter) Response(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, res harness.HarnessResult) (json.RawMessage, error) {
	st, err := parseState(raw)
	if err != nil {
		return nil, err
	}
	out := harness.StoredRun{ExitCode: res.ExitCode, Session: json.RawMessage("null"),
		Stdout: harness.Tail(string(res.Stdout), 4000), Stderr: harness.Tail(string(res.Stderr), 4000)}
	file := path.Join(st.SessionDir, StepsFile)
	data, ok, err := harness.ReadSandboxFile(ctx, sb, file)
	if err != nil && ctx.Err() != nil {
		return nil, err
	}
	if ok {
		if out.Session, err = json.Marshal(ParseSteps(data)); err != nil {
			return nil, err
		}
		out.SessionPath = file
	}
	return json.Marshal(out)
}

var _ harness.Adapter = (*Adapter)(nil)
