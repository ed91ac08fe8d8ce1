package opensandbox_test

import (
	"context"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
	"github.com/ngharness/ngharness/test/fakeexecd"
)

// TestConformance runs the sandbox conformance suite over the opensandbox
// backend and the fake OpenSandbox (real execd's behaviour and timing):
// exec semantics and quoting, the timeout killed inside, a cancelled exec
// ended inside, uploads, create/snapshot/fork/delete, and a sandbox
// deleted under a command (sandbox.ErrGone naming it). With
// NGHARNESS_OPENSANDBOX_URL (and _API_KEY, _IMAGE) set it runs against
// that real server instead, looking into the sandboxes through their own
// exec.
func TestConformance(t *testing.T) {
	real, ok, err := fakeexecd.RealServer()
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		b, err := opensandbox.New(opensandbox.Options{Server: real.URL, APIKey: real.APIKey, Image: real.Image, Root: real.Root, Workdir: real.Workdir})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("against the real OpenSandbox server %s, image %s", real.URL, real.Image)
		sandboxtest.Run(t, sandboxtest.Fixture{
			Lender: b, Backend: b,
			Delete: func(id string) error { return b.Lifecycle().Delete(context.Background(), id) },
		})
		return
	}
	f := newFixture(t)
	sandboxtest.Run(t, sandboxtest.Fixture{
		Lender: f.b, Backend: f.b, HostFolder: f.srv.HostPath, MountPoint: f.srv.MountPoint(),
		Delete: f.srv.Delete,
	})
}
