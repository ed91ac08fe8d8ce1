package opensandbox_test

import (
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
)

// TestConformance runs the sandbox conformance suite over the opensandbox
// backend and the fake OpenSandbox: exec semantics and quoting, the
// timeout killed inside, uploads, create/snapshot/fork/delete, and a
// sandbox deleted under a command (sandbox.ErrGone naming it).
func TestConformance(t *testing.T) {
	f := newFixture(t)
	sandboxtest.Run(t, sandboxtest.Fixture{
		Lender: f.b, Backend: f.b, HostFolder: f.srv.HostPath, MountPoint: f.srv.MountPoint(),
		Delete: f.srv.Delete,
	})
}
