package harness_test

import (
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/hosttest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
)

// batchingSandbox is a sandbox with the HostBatcher capability; nothing
// runs in it.
type batchingSandbox struct{ sandbox.Sandbox }

func (batchingSandbox) BatchKey() string                    { return "host-1" }
func (batchingSandbox) HostPathOf(p string) (string, error) { return "/host" + p, nil }

// TestLentSandboxUnwraps proves that a sandbox's capabilities are found
// through a LentSandbox, by value and by pointer, so launch
// control needs no special case for it.
func TestLentSandboxUnwraps(t *testing.T) {
	lent := harness.LentSandbox{Sandbox: batchingSandbox{}}
	for name, sb := range map[string]sandbox.Sandbox{"value": lent, "pointer": &lent} {
		hb, ok := sandbox.AsHostBatcher(sb)
		if !ok || hb.BatchKey() != "host-1" {
			t.Errorf("%s: AsHostBatcher(LentSandbox) = %v, %v; want the lent sandbox's batcher", name, hb, ok)
		}
	}
	if _, ok := sandbox.AsHostBatcher(harness.LentSandbox{Sandbox: hosttest.New(t)}); ok {
		t.Errorf("a LentSandbox of a sandbox without the capability has it")
	}
}
