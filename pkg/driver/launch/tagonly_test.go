package launch

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
)

// hostSandbox runs every exec on this machine, in its own process group,
// with the request's environment added to the test's: the tag-only
// wrapper's shell runs for real.
type hostSandbox struct{ dir string }

func (h hostSandbox) ID() string { return "host" }
func (h hostSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	cmd := exec.CommandContext(ctx, req.Argv[0], req.Argv[1:]...)
	cmd.Dir = h.dir
	cmd.Env = os.Environ()
	for k, v := range req.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return sandbox.ExecResult{ExitCode: ee.ExitCode(), Stdout: out.Bytes(), Stderr: errb.Bytes()}, nil
	}
	return sandbox.ExecResult{Stdout: out.Bytes(), Stderr: errb.Bytes()}, err
}
func (h hostSandbox) Upload(context.Context, string, []byte, uint32) error {
	return errors.New("no uploads here")
}
func (h hostSandbox) Root() string    { return h.dir }
func (h hostSandbox) Workdir() string { return h.dir }

// TestTagOnlyStdin proves that a tag-only launch reads LaunchSpec.Stdin as its
// stdin byte for byte (a quote and a space in the file's name, text that a
// shell would expand), reads nothing without it, and that a stdin file
// that cannot be read fails the start, naming it, with nothing started.
func TestTagOnlyStdin(t *testing.T) {
	dir := t.TempDir()
	sb := hostSandbox{dir: dir}
	input := "$(touch pwned) `id` 'q'\n{\"type\":\"user\"}"
	file := filepath.Join(dir, "in put's")
	if err := os.WriteFile(file, []byte(input), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(name, stdin string) (string, error) {
		ref := Ref{ID: "tagonly-" + name, Dir: filepath.Join(dir, name)}
		if err := (tagOnlyLauncher{}).Start(context.Background(), sb, ref, harness.LaunchSpec{Argv: []string{"cat"}, Stdin: stdin}); err != nil {
			return "", err
		}
		deadline := time.Now().Add(time.Minute)
		for {
			r, ended, err := (tagOnlyLauncher{}).Wait(context.Background(), sb, ref, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if ended {
				if r.ExitCode != 0 {
					t.Fatalf("cat exited %d", r.ExitCode)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the launch %s did not end", ref.ID)
			}
		}
		out, err := os.ReadFile(filepath.Join(ref.Dir, "stdout"))
		return string(out), err
	}
	if got, err := run("with", file); err != nil || got != input {
		t.Errorf("with Stdin the harness read %q (%v), want %q", got, err, input)
	}
	if got, err := run("without", ""); err != nil || got != "" {
		t.Errorf("without Stdin the harness read %q (%v), want nothing", got, err)
	}
	missing := filepath.Join(dir, "none")
	if _, err := run("missing", missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("a missing stdin file: %v, want an error naming it", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "missing", "stdout")); err == nil {
		t.Errorf("the launch with a missing stdin file started")
	}
	if _, err := os.Stat(filepath.Join(dir, "pwned")); err == nil {
		t.Errorf("the stdin's text ran as a command")
	}
}
