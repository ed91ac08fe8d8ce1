package driver_test

import (
	"context"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// batchingSandbox is a sandbox with the HostBatcher capability; nothing
// runs in it.
type batchingSandbox struct{ sandbox.Sandbox }

func (batchingSandbox) BatchKey() string                    { return "host-1" }
func (batchingSandbox) HostPathOf(p string) (string, error) { return "/host" + p, nil }

// TestLentSandboxUnwraps proves that a sandbox's capabilities are found
// through the driver's LentSandbox, by value and by pointer, so launch
// control needs no special case for it.
func TestLentSandboxUnwraps(t *testing.T) {
	lent := driver.LentSandbox{Sandbox: batchingSandbox{}}
	for name, sb := range map[string]sandbox.Sandbox{"value": lent, "pointer": &lent} {
		hb, ok := sandbox.AsHostBatcher(sb)
		if !ok || hb.BatchKey() != "host-1" {
			t.Errorf("%s: AsHostBatcher(LentSandbox) = %v, %v; want the lent sandbox's batcher", name, hb, ok)
		}
	}
	if _, ok := sandbox.AsHostBatcher(driver.LentSandbox{Sandbox: plainSandbox{}}); ok {
		t.Errorf("a LentSandbox of a sandbox without the capability has it")
	}
}

// plainSandbox has no capability beyond Sandbox.
type plainSandbox struct{}

func (plainSandbox) ID() string { return "plain" }
func (plainSandbox) Exec(context.Context, sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{}, nil
}
func (plainSandbox) Upload(context.Context, string, []byte, uint32) error { return nil }
func (plainSandbox) Root() string                                         { return "/root" }
func (plainSandbox) Workdir() string                                      { return "/work" }
