package driver

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/proto"
)

// exitCodeFile is where an unsupervised launch's wrapper records the
// harness's exit code.
const exitCodeFile = "exit-code"

// unsupervisedScript starts "$@" tagged, detached in a session of its own,
// output to the launch folder, and records its exit code when it ends. The
// folder is $0; nothing of the command is ever part of the script's text.
const unsupervisedScript = `mkdir -p "$0" || exit 1
setsid sh -c '"$@" >"$0/stdout" 2>"$0/stderr" </dev/null; echo $? >"$0/exit-code.tmp"; mv "$0/exit-code.tmp" "$0/exit-code"' "$0" "$@" >/dev/null 2>&1 </dev/null &
echo started`

// StartUnsupervised launches spec without a supervisor: the fallback when
// ngsup cannot supervise. Every process it starts carries the launch's tag,
// which is how pause, continue and stop find them (ngsup --id).
func (n *Ngsup) StartUnsupervised(ctx context.Context, sb sandbox.Sandbox, ref LaunchRef, spec LaunchSpec) error {
	env := map[string]string{proto.TagEnv: ref.ID}
	for k, v := range spec.Env {
		env[k] = v
	}
	argv := append([]string{"sh", "-c", unsupervisedScript, ref.Dir}, spec.Argv...)
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: argv, Env: env, Dir: spec.Dir, Timeout: 60 * time.Second})
	if err != nil {
		return fmt.Errorf("%w: start unsupervised in %s: %v", ErrLaunch, sb.ID(), err)
	}
	if res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "started" {
		return fmt.Errorf("%w: start unsupervised in %s exited %d: %s", ErrLaunch, sb.ID(), res.ExitCode, stderrLine(res))
	}
	return nil
}

// WaitUnsupervised polls for the exit code an unsupervised launch records,
// for up to chunk. The receipt it returns is made up from that file.
func (n *Ngsup) WaitUnsupervised(ctx context.Context, sb sandbox.Sandbox, ref LaunchRef, chunk time.Duration) (*proto.Receipt, bool, error) {
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
