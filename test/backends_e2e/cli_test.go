package backends_e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/internal/syncbuf"
)

// TestNgdriverServeWithEachBackend proves the wiring a user configures:
// `ngdriver owner serve --backend NAME --config FILE` lends sandboxes of
// the backend the config's backends section describes, `ngdriver serve
// --config FILE` reaches them through the same section, and a rollout
// POSTed to /run comes back verified, with its launch in a sandbox of that
// backend.
func TestNgdriverServeWithEachBackend(t *testing.T) {
	for _, name := range []string{"opensandbox", "docker", "kubectl"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := drivertest.NewOn(t, name)
			mp := e.Local.MountPoint()
			section := map[string]any{"root": mp + "/.ngharness", "workdir": mp + "/work", "image": "ubuntu:24.04"}
			env := os.Environ()
			switch name {
			case "opensandbox":
				section["server"] = e.OpenSandbox.URL()
				section["api_key_env"] = "NGH_E2E_OSB_KEY"
				section["ttl"] = "1h"
				env = append(env, "NGH_E2E_OSB_KEY="+drivertest.OpenSandboxAPIKey)
			case "docker":
				section["env"] = []string{"FAKECLI_BASE=" + e.FakeCLIBase()}
			case "kubectl":
				section["env"] = []string{"FAKECLI_BASE=" + e.FakeCLIBase()}
				section["namespace"] = "rollouts"
				section["snapshot_dir"] = filepath.Join(e.FakeCLIBase(), "tars")
			}
			cfg := map[string]any{
				"adapter": "fake", "log_format": "json", "token": "e2e-token", "stop_grace": "1s",
				"backends": map[string]any{name: section},
			}
			data, _ := json.Marshal(cfg) // JSON is YAML
			cfgPath := filepath.Join(t.TempDir(), "ngdriver.yaml")
			if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
				t.Fatal(err)
			}
			ownerURL := startServer(t, env, "owner", "serve", "--listen", "127.0.0.1:0", "--backend", name, "--config", cfgPath)
			driverURL := startServer(t, env, "serve", "--config", cfgPath, "--listen", "127.0.0.1:0", "--owner", ownerURL)

			ro := e.Rollout("cli")
			body := task(ro, "count", 3, 0.2)
			resp, err := http.Post(driverURL+"/run", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var r drivertest.Result
			if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &r) != nil || r.Reward != 1 || len(r.Launches) != 1 {
				t.Fatalf("POST /run: %d %s", resp.StatusCode, raw)
			}
			id := r.Launches[0].SandboxID
			if _, err := os.Stat(e.HostPath(id)); err == nil {
				t.Errorf("the owner kept sandbox %s after the session closed (remove-unused is the default for %s)", id, name)
			}
		})
	}
}

// startServer starts `ngdriver ARGS...` in a process group of its own,
// waits for the address it prints, and stops it (SIGTERM, then SIGKILL to
// its group) when the test ends, before the cleanup of the test's
// drivertest.Env.
func startServer(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(ngdriverPath, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("ngdriver %s log:\n%s", args[0], stderr.String())
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				addr <- u
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case u := <-addr:
		return u
	case <-exited:
		t.Fatalf("ngdriver %v exited: %s", args, stderr.String())
	case <-time.After(drivertest.Patience):
		t.Fatalf("ngdriver %v printed no address: %s", args, stderr.String())
	}
	return ""
}
