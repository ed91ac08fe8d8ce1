package drivertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/dockertest"
	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/docker"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/kubectl"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// BackendEnv names the backend New runs an Env on (NewOn takes the name
// instead): "" or "local" (the default), "opensandbox" (the fake
// OpenSandbox of internal/fake/execd), "docker" or "kubectl" (the fake
// clients of internal/fake/cli, which Main builds). `make test` runs the
// driver's suite once per backend of its DRIVER_BACKENDS, each a `go test
// ./pkg/driver/` with this variable set (`make test-driver-<name>` runs
// one). Every fake keeps its sandboxes in the Env's local backend (a
// kubectl pod NS/POD in its folder k8s-NS.POD), so every helper that looks
// at a sandbox on the host works unchanged; only the driver's execs and
// uploads, and the owner's create, snapshot, fork and remove, go through
// the backend named.
//
// "docker-real" (BackendRealDocker) is the docker backend and a real
// engine (see internal/dockertest: the test skips, saying why, when none
// was started): the owner lends containers of the engine's base image, and
// the helpers read their files below each container's merged folder and
// find their processes by its pid namespace.
//
// "opensandbox-real" (BackendRealOpenSandbox) is for NewOn only.
const BackendEnv = "DRIVERTEST_BACKEND"

// BackendRealDocker is the value of BackendEnv for a real Docker engine.
const BackendRealDocker = "docker-real"

// BackendRealOpenSandbox names a real OpenSandbox server (NewOn only): the
// one fakeexecd.RealServer reads from the environment; the test skips
// when none is named. Its sandboxes are not seen from this machine: the
// helpers that read a sandbox's files or processes on the host find
// nothing there, a test looks through the sandbox's exec (Env.Open). Every
// sandbox the owner makes carries fakeexecd.RealLabel, and the Env's
// cleanup removes them and their snapshots from the server.
const BackendRealOpenSandbox = "opensandbox-real"

// OpenSandboxAPIKey is the API key of the fake OpenSandbox server of the
// backend "opensandbox" (it refuses a request without it).
const OpenSandboxAPIKey = "drivertest-key"

// realDockerSkips are the driver tests that cannot run against a real
// engine, and why.
var realDockerSkips = map[string]string{
	"TestContinueThatFindsNothingRelaunches":     "it kills the pids of the launch's paused set as host pids, and in a container they are the container's",
	"TestSameRolloutOnOneHostNeverSharesALaunch": "it SIGKILLs the supervisor; in a container, with no cgroup to search, the fake harness's child that cleared its environment is then re-parented to the container's first process and no source of ngsup stop names it",
}

// withBackend sets up the backend named name (see BackendEnv) on the
// Env's local backend: the backend the Runner connects through (wrapped
// as e.Backend), the sandboxes the owner lends (e.Lender), how the Env
// looks into them, and how a sandbox is deleted behind the owner's back.
func (e *Env) withBackend(name string) {
	t, lb := e.T, e.Local
	t.Helper()
	root, work := lb.MountPoint()+"/"+local.RootFolder, lb.MountPoint()+"/"+local.WorkFolder
	var inner sandbox.Backend
	switch name {
	case "local":
		inner, e.Lender, e.view = lb, lb.Lender(), localView{lb: lb}
		e.del = func(id string) error {
			// As a machine losing it: Remove renames the folder away
			// first, then ends its processes. Killing them first (as this
			// did) left a moment in which the launch had ended and its
			// folder was still there: the owner's verify then graded the
			// half-done work (reward 0) instead of failing on a sandbox
			// that is gone, and TestSandboxDeletedMidRun failed in CI-20.
			return lb.Remove(context.Background(), id)
		}
	case "opensandbox":
		srv, err := fakeexecd.Start(fakeexecd.Options{Store: lb, APIKey: OpenSandboxAPIKey, Log: e.Log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		b, err := opensandbox.New(opensandbox.Options{Server: srv.URL(), APIKey: OpenSandboxAPIKey, Image: "fake", Root: root, Workdir: work, Poll: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		e.OpenSandbox = srv
		inner, e.Lender, e.view, e.del = b, b, localView{lb: lb}, srv.Delete
	case "docker":
		bin, fake := fakeCLI(t, name)
		b, err := docker.New(docker.Options{Binary: bin, Env: []string{"FAKECLI_BASE=" + lb.Base()}, Image: "fake", Root: root, Workdir: work})
		if err != nil {
			t.Fatal(err)
		}
		checkFake(t, name, b.Client(), fake)
		inner, e.Lender, e.view = b, b, localView{lb: lb}
		e.del = func(id string) error { return e.runFakeCLI(fake, "rm", "-f", id) }
	case "kubectl":
		bin, fake := fakeCLI(t, name)
		b, err := kubectl.New(kubectl.Options{Binary: bin, Env: []string{"FAKECLI_BASE=" + lb.Base()}, Namespace: "rollouts", Image: "fake",
			Root: root, Workdir: work, SnapshotDir: lb.Base() + "/tars"})
		if err != nil {
			t.Fatal(err)
		}
		checkFake(t, name, b.Client(), fake)
		inner, e.Lender, e.view = b, b, localView{lb: lb, pods: true}
		e.del = func(id string) error {
			ns, pod, _ := strings.Cut(id, "/")
			return e.runFakeCLI(fake, "delete", "pod", pod, "-n", ns, "--grace-period=0", "--force")
		}
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
		v := &dockerView{eng: eng, b: b, mountPoint: lb.MountPoint(), local: localView{lb: lb}}
		realMu.Lock()
		realViews[v] = true
		realMu.Unlock()
		t.Cleanup(func() {
			realMu.Lock()
			delete(realViews, v)
			realMu.Unlock()
		})
		inner, e.Lender, e.view = b, b, v
		e.del = func(id string) error {
			_, err := eng.Docker("rm", "-f", id)
			return err
		}
	case BackendRealOpenSandbox:
		real, ok, err := fakeexecd.RealServer()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Skipf("%s is not set: no real OpenSandbox server to run against", fakeexecd.RealURLEnv)
		}
		b, err := opensandbox.New(opensandbox.Options{Server: real.URL, APIKey: real.APIKey, Image: real.Image, Root: real.Root, Workdir: real.Workdir,
			Metadata: map[string]string{fakeexecd.RealLabel: fakeexecd.RunLabel}})
		if err != nil {
			t.Fatal(err)
		}
		lender := &fakeexecd.Lender{Backend: b}
		inner, e.Lender, e.view, e.sweep = b, lender, remoteView{b: b, local: localView{lb: lb}}, lender.Sweep
		e.del = func(id string) error { return b.Remove(context.Background(), id) }
	default:
		t.Fatalf("drivertest: no backend %q: want local, opensandbox, docker, kubectl, %s or %s", name, BackendRealDocker, BackendRealOpenSandbox)
	}
	e.Backend = NewBackend(inner)
}

// fakeCLI returns the fake docker or kubectl (internal/fake/cli), built
// first if it is not yet: bin is "" when the fake is the one on PATH (as
// test/backends_e2e's TestMain puts it), so that the backend finds it by
// name as it would the real client, else its path.
func fakeCLI(t *testing.T, name string) (bin, fake string) {
	t.Helper()
	if _, err := testkit.Build(name); err != nil {
		t.Fatalf("drivertest: %v", err)
	}
	fake = testkit.Bin(name)
	if p, err := exec.LookPath(name); err == nil && p == fake {
		return "", fake
	}
	return fake, fake
}

// checkFake fails the test unless the backend runs the fake client.
func checkFake(t *testing.T, name, client, fake string) {
	t.Helper()
	if client != fake {
		t.Fatalf("drivertest: the %s backend runs %s, not the fake %s", name, client, fake)
	}
}

// runFakeCLI runs the fake docker or kubectl as a person would, against
// the Env's containers or pods.
func (e *Env) runFakeCLI(fake string, args ...string) error {
	cmd := exec.Command(fake, args...)
	cmd.Env = append(os.Environ(), "FAKECLI_BASE="+e.Local.Base())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %v: %s", fake, args, err, out)
	}
	return nil
}

// DeleteSandbox deletes the sandbox id behind the owner's back, through
// its service as a person or a failure would: DELETE on the fake
// OpenSandbox (fakeexecd.Server.Delete) or the real one, `docker rm -f`,
// `kubectl delete pod --grace-period=0 --force`; a local sandbox has its
// processes killed, then its folder removed, as a machine losing it.
func (e *Env) DeleteSandbox(id string) error { return e.del(id) }

// FakeCLIBase is the folder the fake docker and kubectl keep their state
// and sandboxes in (their FAKECLI_BASE): the Env's local backend's base.
func (e *Env) FakeCLIBase() string { return e.Local.Base() }
