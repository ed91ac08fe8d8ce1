package docker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/docker"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// TestMain builds the fake docker client (internal/fake/cli) for this test
// binary.
func TestMain(m *testing.M) { os.Exit(testkit.Main(m, "docker")) }

type world struct {
	base string
	b    *docker.Backend
}

func newWorld(t *testing.T) *world {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the fake docker runs containers in mount namespaces of their own: it needs root")
	}
	base := t.TempDir()
	b, err := docker.New(docker.Options{
		Binary: testkit.Bin("docker"), Env: []string{"FAKECLI_BASE=" + base, "FAKECLI_LOG=" + filepath.Join(base, "calls")},
		Image: "ubuntu:24.04", Root: "/sandbox/.ngharness", Workdir: "/sandbox/work",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { noRefusals(t, filepath.Join(base, "calls")) })
	t.Cleanup(func() {
		// Every container the test left.
		ents, _ := os.ReadDir(filepath.Join(base, "sandboxes"))
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				_ = b.Remove(context.Background(), e.Name())
			}
		}
	})
	return &world{base: base, b: b}
}

func (w *world) host(id string) string { return filepath.Join(w.base, "sandboxes", id) }

// TestConformance runs the sandbox conformance suite over the docker
// backend and the fake docker: exec semantics and quoting, the timeout
// killed inside, uploads through stdin, create/commit/run/rm, a container
// removed under a command (sandbox.ErrGone naming it), and the daemon out
// of reach (sandbox.ErrTransport).
func TestConformance(t *testing.T) {
	w := newWorld(t)
	sandboxtest.Run(t, sandboxtest.Fixture{
		Lender: w.b, Backend: w.b, HostFolder: w.host, MountPoint: local.DefaultMountPoint,
		Delete: func(id string) error { return w.b.Remove(context.Background(), id) },
		Down: func() func() {
			down := filepath.Join(w.base, "down")
			os.WriteFile(down, nil, 0o644)
			return func() { os.Remove(down) }
		},
	})
}

// TestClientFailuresAreClassified proves that the docker client's own
// failures map to the error classes and never pass for a command's exit
// code, and that descriptors and names are checked.
func TestClientFailuresAreClassified(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	sb, err := w.b.Connect(ctx, sandbox.Descriptor{Provider: "docker", SandboxID: "never-made"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
	if !errors.Is(err, sandbox.ErrGone) || !strings.Contains(err.Error(), "No such container: never-made") {
		t.Errorf("exec in a missing container: %v", err)
	}
	if _, err := w.b.Open(ctx, "never-made"); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("open a missing container: %v", err)
	}
	for _, d := range []sandbox.Descriptor{
		{Provider: "kubectl", SandboxID: "x"},
		{SandboxID: "-bad"},
		{SandboxID: "a;b"},
		{SandboxID: "ok", Workdir: "relative"},
	} {
		if _, err := w.b.Connect(ctx, d); err == nil {
			t.Errorf("descriptor %+v was accepted", d)
		}
	}
	if _, err := w.b.Create(ctx, "bad name"); err == nil {
		t.Errorf("a container name with a space was accepted")
	}
	c, err := w.b.Create(ctx, "twice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.b.Create(ctx, "twice"); err == nil || !strings.Contains(err.Error(), "already in use") {
		t.Errorf("a second container of the same name: %v", err)
	}
	// A command whose output mimics the markers changes nothing.
	res, err := c.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `printf '\036ngx-0000-end 0\n' >&2; exit 5`}, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 5 {
		t.Errorf("a command printing a fake marker: %+v %v", res, err)
	}
	if _, err := docker.New(docker.Options{Binary: filepath.Join(w.base, "no-docker")}); err == nil {
		t.Errorf("a missing client was accepted")
	}
}

// noRefusals fails the test if the fake noted, in its log, a command line
// the real client would refuse (or the fake does not model).
func noRefusals(t *testing.T, log string) {
	data, _ := os.ReadFile(log)
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "refused "); ok {
			t.Errorf("the backend sent a command line docker refuses: %s", rest)
		}
	}
}
