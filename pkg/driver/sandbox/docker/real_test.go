package docker_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/dockertest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/docker"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
)

// realMount is where the real containers keep the backend's root and
// workdir; the suite reads them on the host below the container's merged
// folder.
const realMount = "/sandbox"

// prefixed lends the backend's containers under names that start with the
// test's prefix, so that tests sharing one engine never meet.
type prefixed struct {
	*docker.Backend
	prefix string
}

var _ sandbox.Lender = prefixed{}

func (p prefixed) Create(ctx context.Context, name string) (sandbox.Sandbox, error) {
	return p.Backend.Create(ctx, p.prefix+"-"+name)
}

func (p prefixed) Snapshot(ctx context.Context, id, name string) (string, error) {
	return p.Backend.Snapshot(ctx, id, p.prefix+"-"+name)
}

func (p prefixed) Fork(ctx context.Context, snap, name string) (sandbox.Sandbox, error) {
	return p.Backend.Fork(ctx, snap, p.prefix+"-"+name)
}

// TestConformanceRealEngine runs the sandbox conformance suite over the
// docker backend and a real Docker engine (dockerd, runc, overlay2) with a
// GNU userland image: exec semantics and quoting through a real `docker
// exec`, the timeout killed inside the container, a cancelled exec ended in
// it, uploads, commit/run/rm with real images, a container removed under a
// command (sandbox.ErrGone) and the daemon's socket gone
// (sandbox.ErrTransport). It skips, saying why, when no engine was started
// for the tests (dockertest.ImageEnv unset).
func TestConformanceRealEngine(t *testing.T) {
	eng := dockertest.New(t, "ngtest-sbt")
	// The client reaches the daemon through a link this test can remove.
	sock := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		var ok bool
		if sock, ok = strings.CutPrefix(h, "unix://"); !ok {
			t.Skipf("DOCKER_HOST=%s: this test cuts the daemon off by removing a link to its unix socket", h)
		}
	}
	link := filepath.Join(t.TempDir(), "docker.sock")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	b, err := docker.New(docker.Options{
		Binary: eng.Client, Env: []string{"DOCKER_HOST=unix://" + link},
		Image: eng.Image, RunArgs: eng.RunArgs(), SnapshotRepository: eng.SnapshotRepository(),
		Root: realMount + "/.ngharness", Workdir: realMount + "/work",
		// The keeper runs chrooted into /usr, so the suite's scan for the
		// processes that see the container's folder at realMount finds
		// the commands' processes only (the fake's containers have none).
		Command: []string{"chroot", "/usr", "/bin/sleep", "infinity"},
	})
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.Run(t, sandboxtest.Fixture{
		Lender: prefixed{b, eng.Prefix}, Backend: b, MountPoint: realMount,
		HostFolder: func(id string) string {
			c, err := eng.Inspect(id)
			if err != nil {
				return filepath.Join("/nonexistent", id) // gone: nothing is found in it
			}
			return c.MergedDir + realMount
		},
		Delete: func(id string) error { _, err := eng.Docker("rm", "-f", id); return err },
		Down: func() func() {
			if err := os.Remove(link); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := os.Symlink(sock, link); err != nil {
					t.Fatal(err)
				}
			}
		},
	})
}
