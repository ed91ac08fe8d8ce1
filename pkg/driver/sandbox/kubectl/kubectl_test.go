package kubectl_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/kubectl"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/test/backends_e2e/fakecli/build"
)

// fakeKubectl is the fake kubectl built for this test binary.
var fakeKubectl string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kubectl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_, fakeKubectl, err = build.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type world struct {
	base string
	b    *kubectl.Backend
}

func newWorld(t *testing.T) *world {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the fake kubectl runs pods in mount namespaces of their own: it needs root")
	}
	base := t.TempDir()
	b, err := kubectl.New(kubectl.Options{
		Binary: fakeKubectl, Env: []string{"FAKECLI_BASE=" + base}, Namespace: "rl",
		Image: "ubuntu:24.04", Root: "/sandbox/.ngharness", Workdir: "/sandbox/work",
		SnapshotDir: filepath.Join(base, "tars"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ents, _ := os.ReadDir(filepath.Join(base, "sandboxes"))
		for _, e := range ents {
			if ns, pod, ok := strings.Cut(strings.TrimPrefix(e.Name(), "k8s-"), "."); ok {
				_ = b.Remove(context.Background(), ns+"/"+pod)
			}
		}
	})
	return &world{base: base, b: b}
}

// host is the fake's folder of the pod namespace/pod.
func (w *world) host(id string) string {
	ns, pod, _ := strings.Cut(id, "/")
	return filepath.Join(w.base, "sandboxes", "k8s-"+ns+"."+pod)
}

// TestConformance runs the sandbox conformance suite over the kubectl
// backend and the fake kubectl (which also prints kubectl's own notices,
// "Defaulted container" and "command terminated with exit code N", that
// must not reach a command's output): exec semantics and quoting, the
// timeout killed inside, uploads through stdin, run/wait/delete and tar
// snapshots forked into new pods, a pod deleted under a command
// (sandbox.ErrGone naming it), and the API server out of reach
// (sandbox.ErrTransport).
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

// TestIDsAndClientFailures proves the sandbox id forms (pod,
// namespace/pod, namespace/pod/container) and that kubectl's own failures
// map to the error classes.
func TestIDsAndClientFailures(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	for id, want := range map[string]kubectl.Ref{
		"p1":         {Namespace: "rl", Pod: "p1"},
		"ns/p1":      {Namespace: "ns", Pod: "p1"},
		"ns/p1/main": {Namespace: "ns", Pod: "p1", Container: "main"},
	} {
		got, err := w.b.ParseID(id)
		if err != nil || got != want {
			t.Errorf("ParseID(%q) = %+v %v, want %+v", id, got, err, want)
		}
	}
	for _, bad := range []string{"", "a/b/c/d", "NS/p", "ns/-p", "ns/p;x", "ns//p", "ns/p/ c"} {
		if _, err := w.b.ParseID(bad); err == nil {
			t.Errorf("ParseID(%q) accepted", bad)
		}
	}
	ctx := context.Background()
	sb, err := w.b.Connect(ctx, sandbox.Descriptor{Provider: "kubectl", SandboxID: "rl/never-made"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrGone) || !strings.Contains(err.Error(), "never-made") {
		t.Errorf("exec in a missing pod: %v", err)
	}
	if _, err := w.b.Create(ctx, "Not_A_Label"); err == nil {
		t.Errorf("a pod name that is not a DNS label was accepted")
	}
	if _, err := w.b.Fork(ctx, "no-such-snapshot", "fork"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("fork of a missing snapshot: %v", err)
	}
	if _, err := w.b.Snapshot(ctx, "rl/x", "../evil"); err == nil {
		t.Errorf("a snapshot name with a slash was accepted")
	}
}
