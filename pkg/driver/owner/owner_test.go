package owner_test

import (
	"encoding/json"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/owner"
)

func TestHandleAccess(t *testing.T) {
	for _, c := range []struct {
		name, body         string
		ok                 bool
		id, workdir, which string
	}{
		// Gym's main-branch SWE-bench server: the sandbox's id, no workdir.
		{name: "swebench main", body: `{"sandbox_handle": "sbx-123"}`, ok: true, id: "sbx-123"},
		// The lending owner's seed reply.
		{name: "local owner", body: `{"sandbox_handle": "sb-abc-0", "workdir": "/sandbox/work"}`, ok: true, id: "sb-abc-0", workdir: "/sandbox/work"},
		{name: "with a provider", body: `{"sandbox_handle": "x", "provider_config_ref": "opensandbox"}`, ok: true, id: "x", which: "opensandbox"},
		{name: "no handle", body: `{"workdir": "/w"}`},
		{name: "empty handle", body: `{"sandbox_handle": " "}`},
		{name: "handle not a string", body: `{"sandbox_handle": {"sandbox_id": "x"}}`},
		{name: "not an object", body: `["sandbox_handle"]`},
		{name: "no body", body: ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, ok := owner.SeedReply{Body: json.RawMessage(c.body)}.HandleAccess()
			if ok != c.ok {
				t.Fatalf("HandleAccess of %s: ok %v, want %v", c.body, ok, c.ok)
			}
			if !ok {
				return
			}
			d := a.Connection.Descriptor
			if a.Connection.Kind != "direct" || d.SandboxID != c.id || d.Workdir != c.workdir || a.Workdir != c.workdir ||
				d.Provider != c.which || a.Connection.ProviderConfigRef != c.which {
				t.Fatalf("HandleAccess of %s: %+v", c.body, a)
			}
		})
	}
}
