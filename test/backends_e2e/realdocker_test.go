package backends_e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/ngharness/ngharness/internal/dockertest"
	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// The tests of this file use a real Docker engine and the real docker
// client: dockertest found it on PATH before TestMain put the fake docker
// first. They skip, saying why, when no engine was started for the tests
// (NGHARNESS_DOCKER_IMAGE unset; .ci/run sets it).

// TestNgdriverServeRealDocker proves the wiring a user configures against
// a real engine: `ngdriver owner serve --backend docker` lends containers
// of the configured image (run_args, snapshot_repository and binary from
// the config), `ngdriver serve` reaches them through the same section, a
// rollout POSTed to /run comes back verified (its check, run in the
// sandbox, sees /.dockerenv) with its launch in one of them, and the
// container is gone once the session closed.
func TestNgdriverServeRealDocker(t *testing.T) {
	t.Parallel()
	eng := dockertest.New(t, "ngtest-serve")
	section := map[string]any{
		"binary": eng.Client, "image": eng.Image, "run_args": eng.RunArgs(),
		"snapshot_repository": eng.SnapshotRepository(),
		"root":                local.DefaultMountPoint + "/.ngharness", "workdir": local.DefaultMountPoint + "/work",
	}
	cfg := map[string]any{
		"adapter": "fake", "log_format": "json", "token": "e2e-token", "stop_grace": "1s",
		"backends": map[string]any{"docker": section},
	}
	data, _ := json.Marshal(cfg) // JSON is YAML
	cfgPath := filepath.Join(t.TempDir(), "ngdriver.yaml")
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	env := os.Environ()
	ownerURL := startServer(t, env, "owner", "serve", "--listen", "127.0.0.1:0", "--backend", "docker", "--config", cfgPath)
	driverURL := startServer(t, env, "serve", "--config", cfgPath, "--listen", "127.0.0.1:0", "--owner", ownerURL)

	ro := "serve-real-" + runTag
	// The owner's check runs in the sandbox: it passes in a container of
	// the engine only (/.dockerenv).
	var body map[string]any
	_ = json.Unmarshal(task(ro, "count", 3, 0.2), &body)
	body["check"] = "test -f /.dockerenv && " + body["check"].(string)
	data, _ = json.Marshal(body)
	resp, err := http.Post(driverURL+"/run", "application/json", bytes.NewReader(data))
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
	if _, err := eng.Docker("container", "inspect", "--format", "{{.Name}}", id); err == nil {
		t.Errorf("the owner kept container %s after the session closed (remove-unused is the default for docker)", id)
	}
	if left := eng.Containers(); len(left) > 0 {
		t.Errorf("containers of the test still there after the session closed: %v", left)
	}
}
