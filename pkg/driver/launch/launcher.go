package launch

import (
	"context"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// Budgets of the commands that control a launch.
const (
	// ControlTimeout bounds a pause or continue command.
	ControlTimeout = 120 * time.Second
	// WaitChunk is how long one `ngsup wait` blocks, so no exec stays open
	// for the whole harness.
	WaitChunk = 30 * time.Second
	// StopGrace is the time between SIGINT and SIGKILL of a stop.
	StopGrace = 10 * time.Second
	// outputTail bounds how much of the harness's output is read back.
	outputTail = 1 << 20
)

// Ref names one launch inside its sandbox.
type Ref struct {
	ID        string `json:"id"`
	Dir       string `json:"dir"`
	SandboxID string `json:"sandbox_id"`
	// Supervised says ngsup supervises it (else it runs tagged only).
	Supervised bool `json:"supervised"`
}

// Launcher starts and controls the launches of one kind: supervised by
// `ngsup run`, or tagged only (every process carries the launch's tag,
// which is how ngsup finds them). The launcher that started a launch
// controls it to its end.
type Launcher interface {
	// Supervised says ngsup supervises the launches it starts.
	Supervised() bool
	// Prepare readies sb for launches: ngsup is uploaded once per sandbox.
	Prepare(ctx context.Context, sb sandbox.Sandbox) error
	// Start launches spec as ref and returns once it is under way. An
	// error wrapping ErrNoSupervisor means nothing of it runs and it may
	// be launched tagged only instead.
	Start(ctx context.Context, sb sandbox.Sandbox, ref Ref, spec harness.LaunchSpec) error
	// Wait blocks up to chunk for the launch to end and returns its
	// receipt and whether it ended.
	Wait(ctx context.Context, sb sandbox.Sandbox, ref Ref, chunk time.Duration) (*proto.Receipt, bool, error)
	// Status returns the launch's receipt (ErrNoReceipt when it keeps
	// none).
	Status(ctx context.Context, sb sandbox.Sandbox, ref Ref) (*proto.Receipt, error)
	// Pause holds every process of the launch still and confirms it.
	Pause(ctx context.Context, sb sandbox.Sandbox, ref Ref, rollout string) PauseOutcome
	// Continue continues a paused launch; an error unless every process
	// the pause stopped runs again.
	Continue(ctx context.Context, sb sandbox.Sandbox, ref Ref) (proto.ContinueResult, error)
	// Stop ends the launch: SIGINT, SIGKILL after grace, until none is
	// left.
	Stop(ctx context.Context, sb sandbox.Sandbox, ref Ref, grace time.Duration) (proto.StopResult, error)
	// Output reads the tails of the launch's stdout and stderr.
	Output(ctx context.Context, sb sandbox.Sandbox, ref Ref) (stdout, stderr []byte, err error)
}

// Launchers is what a driver needs of launch control: the launcher of each
// kind, and the stop of every launch in a sandbox. *Ngsup implements it.
type Launchers interface {
	// Launcher returns the launcher of supervised launches, or of launches
	// that run tagged only.
	Launcher(supervised bool) Launcher
	// StopSandbox ends every launch in sb, whichever launcher started it,
	// then stops sb where its backend can.
	StopSandbox(ctx context.Context, sb sandbox.Sandbox) error
}
