package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// TestExecHostPaths: a command marked HostPaths runs outside the mount
// namespace with its paths under the mount point translated to the
// sandbox's folder, so it reads and writes the same files; a path that only
// starts with the mount point's name is left alone.
func TestExecHostPaths(t *testing.T) {
	b := nsBackend(t)
	sb := create(t, b, "hp1")
	mp := b.MountPoint()
	if err := os.WriteFile(filepath.Join(sb.HostPath(), WorkFolder, "f"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", mp + "/work/f"}, HostPaths: true})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "from the host\n" {
		t.Fatalf("cat through HostPaths: %v %+v", err, res)
	}
	// It runs outside the sandbox's view: its mount namespace is the host's.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"readlink", "/proc/self/ns/mnt"}, HostPaths: true})
	host, _ := os.Readlink("/proc/self/ns/mnt")
	if err != nil || strings.TrimSpace(string(res.Stdout)) != host {
		t.Fatalf("HostPaths command ran in mount namespace %q, the host's is %q (%v)", res.Stdout, host, err)
	}
	// Without HostPaths the same command sees the sandbox's view.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"readlink", "/proc/self/ns/mnt"}})
	if err != nil || strings.TrimSpace(string(res.Stdout)) == host {
		t.Fatalf("a plain command ran in the host's mount namespace (%v)", err)
	}
	// Dir is translated too, and the environment applies.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `cat f; echo "$X"`}, Dir: mp + "/work", Env: map[string]string{"X": "x1"}, HostPaths: true})
	if err != nil || string(res.Stdout) != "from the host\nx1\n" {
		t.Fatalf("Dir and Env through HostPaths: %v %+v", err, res)
	}
	for in, want := range map[string]string{
		mp:                  sb.HostPath(),
		mp + "/work/f":      sb.HostPath() + "/work/f",
		mp + "x/work":       mp + "x/work",
		"/elsewhere" + mp:   "/elsewhere" + mp,
		"relative/" + mp:    "relative/" + mp,
		"--dir=" + mp + "/": "--dir=" + mp + "/",
	} {
		if got := sb.hostPath(in); got != want {
			t.Errorf("hostPath(%q) = %q, want %q", in, got, want)
		}
	}
}
