package local

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// TestHostBatcher proves the local sandbox's sandbox.HostBatcher: the
// sandboxes of one backend share a BatchKey (another backend's differ),
// and a HostPaths command run through one sandbox reaches the files of
// the others at their HostPathOf, in either isolation mode; a path outside
// a sandbox's view is refused. AsHostBatcher finds the capability through
// a wrapper.
func TestHostBatcher(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(m.name, func(t *testing.T) {
			b := newBackend(t, m.opt)
			a, c := create(t, b, "hb-a"), create(t, b, "hb-c")
			if a.BatchKey() != c.BatchKey() || a.BatchKey() == "" {
				t.Fatalf("one backend, keys %q and %q", a.BatchKey(), c.BatchKey())
			}
			if other := create(t, newBackend(t, m.opt), "hb-a"); other.BatchKey() == a.BatchKey() {
				t.Errorf("two backends share the key %q", a.BatchKey())
			}
			var paths []string
			for _, sb := range []*Sandbox{a, c} {
				if err := os.WriteFile(filepath.Join(sb.HostPath(), WorkFolder, "f"), []byte(sb.ID()+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				p, err := sb.HostPathOf(sb.Workdir() + "/f")
				if err != nil {
					t.Fatal(err)
				}
				paths = append(paths, p)
			}
			res := run(t, a, sandbox.ExecRequest{Argv: append([]string{"cat"}, paths...), HostPaths: true})
			if res.ExitCode != 0 || string(res.Stdout) != "hb-a\nhb-c\n" {
				t.Errorf("cat of both sandboxes' files through one: exit %d %q (stderr %q)", res.ExitCode, res.Stdout, res.Stderr)
			}
			if _, err := a.HostPathOf("/etc/passwd"); err == nil {
				t.Errorf("HostPathOf accepted a path outside the sandbox")
			}
			hb, ok := sandbox.AsHostBatcher(wrapped{a})
			if !ok || hb.BatchKey() != a.BatchKey() {
				t.Errorf("AsHostBatcher through a wrapper: %v %v", hb, ok)
			}
			if _, ok := sandbox.AsHostBatcher(plain{a}); ok {
				t.Errorf("AsHostBatcher found the capability in a sandbox that hides it")
			}
		})
	}
}

// wrapped hides the local sandbox's methods but unwraps to it.
type wrapped struct{ sandbox.Sandbox }

func (w wrapped) Unwrap() sandbox.Sandbox { return w.Sandbox }

// plain hides them and does not unwrap.
type plain struct{ sandbox.Sandbox }
