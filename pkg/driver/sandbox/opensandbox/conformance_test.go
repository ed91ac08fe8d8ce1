package opensandbox_test

import (
	"context"
	"testing"
	"time"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// TestConformance runs the sandbox conformance suite over the opensandbox
// backend and the fake OpenSandbox (the real server's behaviour and
// timing): exec semantics and quoting, the timeout killed inside, a
// cancelled exec ended inside, uploads, create/snapshot/fork/delete (a
// snapshot a fork uses refused until the fork is gone), and a sandbox
// deleted under a command (sandbox.ErrGone naming it, through the Failed
// window of the delete). Nothing it made is left on the server: no
// sandbox, no snapshot. With NGHARNESS_OPENSANDBOX_URL (and _API_KEY,
// _IMAGE) set it runs against that real server instead, looking into the
// sandboxes through their own exec, every sandbox labelled with this
// test process's fakeexecd.RealLabel, and removes at its end everything
// so labelled or made, with the snapshots taken of it.
func TestConformance(t *testing.T) {
	real, ok, err := fakeexecd.RealServer()
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		b, err := opensandbox.New(opensandbox.Options{Server: real.URL, APIKey: real.APIKey, Image: real.Image, Root: real.Root, Workdir: real.Workdir,
			Metadata: map[string]string{fakeexecd.RealLabel: fakeexecd.RunLabel}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("against the real OpenSandbox server %s, image %s, label %s=%s", real.URL, real.Image, fakeexecd.RealLabel, fakeexecd.RunLabel)
		lender := &fakeexecd.Lender{Backend: b}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if err := lender.Sweep(ctx); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
		sandboxtest.Run(t, sandboxtest.Fixture{
			Lender: lender, Backend: b,
			Delete: func(id string) error { return b.Lifecycle().Delete(context.Background(), id) },
		})
		return
	}
	f := newFixture(t)
	t.Cleanup(func() {
		if left := f.srv.Sandboxes(); len(left) != 0 {
			t.Errorf("sandboxes left on the server: %v", left)
		}
		if left := f.srv.Snapshots(); len(left) != 0 {
			t.Errorf("snapshots left on the server: %v", left)
		}
	})
	sandboxtest.Run(t, sandboxtest.Fixture{
		Lender: f.b, Backend: f.b, HostFolder: f.srv.HostPath, MountPoint: f.srv.MountPoint(),
		Delete: f.srv.Delete,
	})
}
