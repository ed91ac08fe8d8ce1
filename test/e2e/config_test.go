package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runCLI runs ngdriver with args to its end (bounded) and returns its exit
// code, stdout and stderr.
func runCLI(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, ngdriverBin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out, errs strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errs.String()
	case errors.As(err, &ee) && ctx.Err() == nil:
		return ee.ExitCode(), out.String(), errs.String()
	}
	t.Fatalf("ngdriver %s: %v (stderr %s)", strings.Join(args, " "), err, errs.String())
	return 0, "", ""
}

// TestConfigErrors: a config file with an unknown key, a bad duration or a
// bad value makes `ngdriver serve` exit 2 before it listens, with an error
// that names the key or the value (and the file); so does a bad command
// line of `ngdriver owner serve`.
func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	valid := `listen: 127.0.0.1:0
name: cfg-e2e
adapter: fake
stop_grace: 1s
owner:
  url: http://127.0.0.1:1
backends:
  local:
    base: ` + filepath.Join(dir, "base") + "\n"
	cases := []struct {
		name  string
		yaml  string
		words []string
	}{
		{"unknown top-level key", valid + "max_runz: 4\n", []string{"max_runz"}},
		{"unknown nested key", strings.Replace(valid, "  url:", "  urll: http://x\n  url:", 1), []string{"urll"}},
		{"unknown backend key", valid + "    mount_pointt: /sandbox\n", []string{"mount_pointt"}},
		{"bad duration", strings.Replace(valid, "stop_grace: 1s", "stop_grace: 10 parsecs", 1), []string{"10 parsecs", "line 4"}},
		{"bare number duration", valid + "shutdown_timeout: 30\n", []string{"30", "duration"}},
		{"negative duration", valid + "shutdown_timeout: -5s\n", []string{"-5s"}},
		{"bad adapter", strings.Replace(valid, "adapter: fake", "adapter: fakes", 1), []string{"fakes"}},
		{"bad max_runs type", valid + "max_runs: many\n", []string{"many"}},
		{"negative max_runs", valid + "max_runs: -1\n", []string{"max_runs"}},
		{"bad isolation", valid + "    isolation: chroot\n", []string{"chroot"}},
		{"not yaml", "listen: [\n", []string{"ngdriver.yaml"}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ngdriver.yaml")
			if err := os.WriteFile(path, []byte(c.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			code, out, errs := runCLI(t, nil, "serve", "--config", path)
			if code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", code, errs)
			}
			if strings.Contains(out, "listening") {
				t.Errorf("it listened despite the bad config: %q", out)
			}
			for _, w := range append(c.words, path) {
				if !strings.Contains(errs, w) {
					t.Errorf("the error %q does not name %q", strings.TrimSpace(errs), w)
				}
			}
			if n := strings.Count(strings.TrimSpace(errs), "\n"); n > 0 {
				t.Errorf("the error takes %d lines, want one: %q", n+1, errs)
			}
		})
	}
	t.Run("missing_file", func(t *testing.T) {
		path := filepath.Join(dir, "nope.yaml")
		code, _, errs := runCLI(t, nil, "serve", "--config", path)
		if code != 2 || !strings.Contains(errs, path) {
			t.Errorf("exit %d, stderr %q; want 2 naming %s", code, errs, path)
		}
	})
	t.Run("owner_relative_base", func(t *testing.T) {
		code, _, errs := runCLI(t, nil, "owner", "serve", "--listen", "127.0.0.1:0", "--base", "relative/dir")
		if code != 2 || !strings.Contains(errs, "relative/dir") {
			t.Errorf("exit %d, stderr %q; want 2 naming the folder", code, errs)
		}
	})
	t.Run("unknown_flag", func(t *testing.T) {
		code, _, errs := runCLI(t, nil, "serve", "--confg", "x")
		if code != 2 || !strings.Contains(errs, "confg") {
			t.Errorf("exit %d, stderr %q; want 2 naming the flag", code, errs)
		}
	})
}
