package sandboxtest_test

import (
	"os"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// TestLocalConformance runs the suite over the local backend, the control:
// what the other backends must do, the reference does. (A local sandbox
// is never deleted behind its owner's back, so that test is left out.)
func TestLocalConformance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the local backend's mount namespaces need root")
	}
	b, err := local.New(t.TempDir(), local.Options{Isolation: local.IsolationNamespace})
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.Run(t, sandboxtest.Fixture{
		Lender: b.Lender(), Backend: b, HostFolder: b.HostPath, MountPoint: b.MountPoint(),
	})
}
