package launch

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// exitCodeFile is where a tag-only launch's wrapper records the harness's
// exit code.
const exitCodeFile = "exit-code"

// tagOnlyScript starts the command after $1 tagged, detached in a session
// of its own, its stdin the file $1, output to the launch folder, and
// records its exit code when it ends. The folder is $0; nothing of the
// command is ever part of the script's text.
const tagOnlyScript = `mkdir -p "$0" || exit 1
[ -r "$1" ] || { echo "the harness's stdin $1 cannot be read" >&2; exit 1; }
setsid sh -c 'in=$1; shift; "$@" >"$0/stdout" 2>"$0/stderr" <"$in"; echo $? >"$0/exit-code.tmp"; mv "$0/exit-code.tmp" "$0/exit-code"' "$0" "$@" >/dev/null 2>&1 </dev/null &
echo started`

// tagOnlyLauncher launches without a supervisor: the fallback when ngsup
// cannot supervise. Every process it starts carries the launch's tag,
// which is how pause, continue and stop find them (ngsup --id).
type tagOnlyLauncher struct{ control }

// Supervised is false: these launches run tagged only.
func (tagOnlyLauncher) Supervised() bool { return false }

// Start launches spec tagged, in a session of its own.
func (tagOnlyLauncher) Start(ctx context.Context, sb sandbox.Sandbox, ref Ref, spec harness.LaunchSpec) error {
	env := map[string]string{proto.TagEnv: ref.ID}
	for k, v := range spec.Env {
		env[k] = v
	}
	stdin := spec.Stdin
	if stdin == "" {
		stdin = "/dev/null"
	}
	argv := append([]string{"sh", "-c", tagOnlyScript, ref.Dir, stdin}, spec.Argv...)
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: argv, Env: env, Dir: spec.Dir, Timeout: 60 * time.Second})
	if err != nil {
		return fmt.Errorf("%w: start unsupervised in %s: %w", ErrLaunch, sb.ID(), err)
	}
	if res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "started" {
		return fmt.Errorf("%w: start unsupervised in %s exited %d: %s", ErrLaunch, sb.ID(), res.ExitCode, stderrLine(res))
	}
	return nil
}

// Wait polls for the exit code the launch records, for up to chunk. The
// receipt it returns is made up from that file.
func (tagOnlyLauncher) Wait(ctx context.Context, sb sandbox.Sandbox, ref Ref, chunk time.Duration) (*proto.Receipt, bool, error) {
	deadline := time.Now().Add(chunk)
	for {
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", path.Join(ref.Dir, exitCodeFile)}, Timeout: 30 * time.Second, HostPaths: true})
		if err != nil {
			return nil, false, fmt.Errorf("wait for the unsupervised launch %s: %w", ref.ID, err)
		}
		if res.ExitCode == 0 {
			code, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
			if err != nil {
				code = -1
			}
			return &proto.Receipt{ID: ref.ID, Ended: true, ExitCode: code}, true, nil
		}
		if time.Now().After(deadline) {
			return &proto.Receipt{ID: ref.ID, ExitCode: -1}, false, nil
		}
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Status is ErrNoReceipt: the launch keeps none.
func (tagOnlyLauncher) Status(_ context.Context, sb sandbox.Sandbox, ref Ref) (*proto.Receipt, error) {
	return nil, fmt.Errorf("ask %s for the status of launch %s: %w", sb.ID(), ref.ID, ErrNoReceipt)
}
