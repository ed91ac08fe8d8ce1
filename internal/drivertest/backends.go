package drivertest

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/dockertest"
	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/docker"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// BackendEnv names the backend the driver's tests run through: "" or
// "local" (the default), "opensandbox" (the fake OpenSandbox of
// internal/fake/execd) or "docker" (the fake docker client of
// internal/fake/cli, which Main builds). `make test` runs the suite once
// per backend of its DRIVER_BACKENDS, each a `go test ./pkg/driver/` with
// this variable set (`make test-driver-<name>` runs one). Either fake keeps its sandboxes
// in the Env's local backend, so every helper that looks at a
// sandbox on the host works unchanged; only the driver's execs and
// uploads, and the owner's create, snapshot, fork and remove, go through
// the backend named.
//
// "docker-real" (BackendRealDocker) is the docker backend and a real
// engine (see internal/dockertest: the test skips, saying why, when none
// was started): the owner lends containers of the engine's base image, and
// the helpers read their files below each container's merged folder and
// find their processes by its pid namespace.
const BackendEnv = "DRIVERTEST_BACKEND"

// BackendRealDocker is the value of BackendEnv for a real Docker engine.
const BackendRealDocker = "docker-real"

// realDockerSkips are the driver tests that cannot run against a real
// engine, and why.
var realDockerSkips = map[string]string{
	"TestContinueThatFindsNothingRelaunches":     "it kills the pids of the launch's paused set as host pids, and in a container they are the container's",
	"TestSameRolloutOnOneHostNeverSharesALaunch": "it SIGKILLs the supervisor; in a container, with no cgroup to search, the fake harness's child that cleared its environment is then re-parented to the container's first process and no source of ngsup stop names it",
}

// withBackend returns the backend the Runner connects through, the
// sandboxes the owner lends (on lb's folders, but for a real engine) and
// how the Env looks into them.
func withBackend(t *testing.T, lb *local.Backend) (sandbox.Backend, sandbox.Lender, hostView) {
	t.Helper()
	root, work := lb.MountPoint()+"/"+local.RootFolder, lb.MountPoint()+"/"+local.WorkFolder
	switch name := os.Getenv(BackendEnv); name {
	case "", "local":
		return lb, lb.Lender(), localView{lb}
	case "opensandbox":
		srv, err := fakeexecd.Start(fakeexecd.Options{Store: lb})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		b, err := opensandbox.New(opensandbox.Options{Server: srv.URL(), Image: "fake", Root: root, Workdir: work, Poll: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return b, b, localView{lb}
	case "docker":
		fake := testkit.Bin("docker")
		if fake == "" {
			t.Fatalf("drivertest: %s=docker: the fake docker was not built (drivertest.Main builds it)", BackendEnv)
		}
		b, err := docker.New(docker.Options{Binary: fake, Env: []string{"FAKECLI_BASE=" + lb.Base()}, Image: "fake", Root: root, Workdir: work})
		if err != nil {
			t.Fatal(err)
		}
		return b, b, localView{lb}
	case BackendRealDocker:
		top, _, _ := strings.Cut(t.Name(), "/")
		if why := realDockerSkips[top]; why != "" {
			t.Skipf("%s=%s: %s", BackendEnv, name, why)
		}
		eng := dockertest.New(t, "ngtest-drv")
		b, err := docker.New(docker.Options{
			Binary: eng.Client, Image: eng.Image, RunArgs: eng.RunArgs(),
			SnapshotRepository: eng.SnapshotRepository(), Root: root, Workdir: work,
		})
		if err != nil {
			t.Fatal(err)
		}
		v := &dockerView{eng: eng, b: b, mountPoint: lb.MountPoint(), local: localView{lb}}
		realMu.Lock()
		realViews[v] = true
		realMu.Unlock()
		t.Cleanup(func() {
			realMu.Lock()
			delete(realViews, v)
			realMu.Unlock()
		})
		return b, b, v
	default:
		t.Fatalf("drivertest: %s=%q: want local, opensandbox, docker or %s", BackendEnv, name, BackendRealDocker)
		return nil, nil, nil
	}
}
