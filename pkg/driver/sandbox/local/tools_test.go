package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// TestSharedToolIsTheInstalledContentWheneverItRuns proves the rules of
// the shared tools folder: a tool whose content does not match its sum is
// refused; a file planted at a tool's path before it is installed (wrong
// content, a symlink to a host file) is replaced, never followed or used;
// a command naming a file of the tools folder this backend did not install
// is refused before it runs; and a tool changed after its install (its
// content, or replaced by a symlink) is put back before a command runs it,
// with or without namespace isolation, HostPaths or not.
func TestSharedToolIsTheInstalledContentWheneverItRuns(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(m.name, func(t *testing.T) {
			b := newBackend(t, m.opt)
			sb := create(t, b, "sb")
			ctx := context.Background()
			data := []byte("#!/bin/sh\necho genuine \"$@\"\n")
			s := sha256.Sum256(data)
			sum := hex.EncodeToString(s[:])

			if _, err := sb.SharedTool(ctx, "tool", []byte("other"), sum); !errors.Is(err, ErrToolSum) {
				t.Errorf("a tool whose content is not its sum: %v, want ErrToolSum", err)
			}
			// Planted before the install: a symlink to a host file.
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, []byte("host file\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(b.Base(), toolsFolder, "tool-"+sum[:16])
			if err := os.Symlink(victim, p); err != nil {
				t.Fatal(err)
			}
			got, err := sb.SharedTool(ctx, "tool", data, sum)
			if err != nil || got != p {
				t.Fatalf("install: %q %v, want %s", got, err, p)
			}
			if v, _ := os.ReadFile(victim); string(v) != "host file\n" {
				t.Errorf("the install wrote through a planted symlink: the host file holds %q", v)
			}
			fi, err := os.Lstat(p)
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o555 {
				t.Fatalf("the installed tool: %v %v, want a regular file, mode 0555", fi, err)
			}

			runs := func(hostPaths bool) string {
				t.Helper()
				res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{p, "x"}, HostPaths: hostPaths})
				if err != nil {
					t.Fatalf("run the tool (HostPaths %v): %v", hostPaths, err)
				}
				return strings.TrimSpace(string(res.Stdout))
			}
			for _, change := range []func() error{
				func() error { return os.WriteFile(p, []byte("#!/bin/sh\necho changed\n"), 0o555) },
				func() error { os.Remove(p); return os.Symlink(victim, p) },
				func() error { return os.Chmod(p, 0o777) },
			} {
				for _, hp := range []bool{true, false} {
					os.Chmod(p, 0o755)
					if err := change(); err != nil {
						t.Fatal(err)
					}
					if out := runs(hp); out != "genuine x" {
						t.Errorf("after a change, the tool printed %q (HostPaths %v)", out, hp)
					}
				}
			}
			if v, _ := os.ReadFile(victim); string(v) != "host file\n" {
				t.Errorf("putting the tool back wrote through a symlink: the host file holds %q", v)
			}

			// A file in the tools folder this backend never installed.
			stranger := filepath.Join(b.Base(), toolsFolder, "ngsup-0123456789abcdef")
			if err := os.WriteFile(stranger, []byte("#!/bin/sh\necho stranger\n"), 0o555); err != nil {
				t.Fatal(err)
			}
			if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{stranger}, HostPaths: true}); !errors.Is(err, ErrToolUnknown) {
				t.Errorf("a file of the tools folder no install made ran: %q %v, want ErrToolUnknown", res.Stdout, err)
			}
		})
	}
}
