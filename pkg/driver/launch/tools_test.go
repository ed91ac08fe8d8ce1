package launch

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// TestLocalSandboxesShareOneReadOnlyNgsup proves that on the local backend
// ngsup is installed once per host, outside every sandbox's folder, and
// that code in a sandbox cannot change the ngsup the host runs for it or
// for another sandbox: a snapshot of a sandbox holds no copy of it (each
// sandbox carried 3.5 MB of ngsup into every snapshot and fork); a write
// to it from inside a sandbox fails; and a file changed behind the
// backend's back (the sandbox's code runs as the backend's user and can
// reach the host) is put back before a control verb runs it on the host
// (HostPaths), in that sandbox and in another. Before, each sandbox held
// its own writable copy, which the host then ran for its verbs.
func TestLocalSandboxesShareOneReadOnlyNgsup(t *testing.T) {
	opt := local.Options{Isolation: local.IsolationNone}
	if os.Geteuid() == 0 {
		opt = local.Options{Isolation: local.IsolationNamespace, MountPoint: filepath.Join(t.TempDir(), "mnt")}
	} else {
		t.Log("not root: without namespace isolation (no read-only mount to test)")
	}
	b, err := local.New(t.TempDir(), opt)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	genuine := filepath.Join(t.TempDir(), "ngsup")
	if err := os.WriteFile(genuine, []byte("#!/bin/sh\necho genuine \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	n := &Ngsup{Binaries: map[string]string{"amd64": genuine, "arm64": genuine}}
	sbA, err := b.Create(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := b.Create(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	pa, err := n.Ensure(ctx, sbA)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := n.Ensure(ctx, sbB)
	if err != nil {
		t.Fatal(err)
	}
	if pa != pb {
		t.Errorf("sandboxes a and b run ngsup from %s and %s, want one shared file", pa, pb)
	}
	for _, sb := range []*local.Sandbox{sbA, sbB} {
		if host, err := sb.HostPathOf(pa); err != nil || strings.HasPrefix(host, sb.HostPath()+"/") {
			t.Errorf("ngsup is at %s (%v), inside sandbox %s's folder %s", host, err, sb.ID(), sb.HostPath())
		}
	}
	if err := b.Snapshot(ctx, "a", "snap-a"); err != nil {
		t.Fatal(err)
	}
	if got := ngsupCopies(t, b.SnapshotPath("snap-a")); len(got) > 0 {
		t.Errorf("the snapshot of a holds copies of ngsup: %v", got)
	}

	verb := func(sb *local.Sandbox) string {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{pa, "status"}, HostPaths: true})
		if err != nil {
			t.Fatalf("run ngsup for %s: %v", sb.ID(), err)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	// The sandbox's code writes over the ngsup it sees, and moves it.
	res, err := sbA.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c",
		`printf '#!/bin/sh\necho hacked\n' >"$0"; mv -f "$0" "$0.moved"; printf '#!/bin/sh\necho hacked\n' >"$0"`, pa}})
	if err != nil {
		t.Fatal(err)
	}
	if b.Isolation() == local.IsolationNamespace && res.ExitCode == 0 {
		t.Errorf("a write to ngsup from inside sandbox a succeeded: %s", res.Stderr)
	}
	for _, sb := range []*local.Sandbox{sbA, sbB} {
		if got := verb(sb); got != "genuine status" {
			t.Errorf("after sandbox a wrote over ngsup, the verb for %s printed %q", sb.ID(), got)
		}
	}
	// Written on the host (as root code in a sandbox can reach it).
	host, _ := sbA.HostPathOf(pa)
	os.Chmod(host, 0o755)
	if err := os.WriteFile(host, []byte("#!/bin/sh\necho hacked\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []*local.Sandbox{sbB, sbA} {
		if got := verb(sb); got != "genuine status" {
			t.Errorf("after the host's file was changed, the verb for %s printed %q", sb.ID(), got)
		}
	}
}

// ngsupCopies lists the files named ngsup-* under dir.
func ngsupCopies(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), "ngsup-") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
