package drivertest

import (
	"os"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/owner/localowner"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/docker"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
	"github.com/ngharness/ngharness/test/fakeexecd"
)

// BackendEnv names the backend the driver's tests run through: "" or
// "local" (the default), "opensandbox" (the fake OpenSandbox of
// test/fakeexecd) or "docker" (the docker client found on PATH, which must
// be the fake of test/backends_e2e/fakecli). Either fake keeps its
// sandboxes in the Env's local backend, so every helper that looks at a
// sandbox on the host works unchanged; only the driver's execs and
// uploads, and the owner's create, snapshot, fork and remove, go through
// the backend named.
const BackendEnv = "DRIVERTEST_BACKEND"

// withBackend returns the backend the Runner connects through and the
// sandboxes the owner lends, on lb's folders.
func withBackend(t *testing.T, lb *local.Backend) (sandbox.Backend, localowner.Sandboxes) {
	t.Helper()
	root, work := lb.MountPoint()+"/"+local.RootFolder, lb.MountPoint()+"/"+local.WorkFolder
	switch name := os.Getenv(BackendEnv); name {
	case "", "local":
		return lb, localowner.Local(lb)
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
		return b, b
	case "docker":
		b, err := docker.New(docker.Options{Env: []string{"FAKECLI_BASE=" + lb.Base()}, Image: "fake", Root: root, Workdir: work})
		if err != nil {
			t.Fatal(err)
		}
		return b, b
	default:
		t.Fatalf("drivertest: %s=%q: want local, opensandbox or docker", BackendEnv, name)
		return nil, nil
	}
}
