package opencode

import (
	"testing"

	"github.com/ngharness/ngharness/pkg/harness"
)

// TestNewChecksTheSharedOptions: OpenCode's options go through the one
// check of every CLI adapter (harness.CLIOptions.Check), as Claude Code's
// and Codex's do: a model_url that is not an http(s) URL and an env name
// that is no variable name are refused, naming the adapter and the key;
// OpenCode's own defaults are filled as before.
func TestNewChecksTheSharedOptions(t *testing.T) {
	for _, c := range []struct {
		opt  Options
		want string
	}{
		{Options{CLIOptions: harness.CLIOptions{ModelURL: "http://h"}}, "opencode: the opencode binary (opencode.opencode) is required"},
		{Options{OpenCode: "oc"}, "opencode: the model server (opencode.model_url) is required"},
		{Options{OpenCode: "oc", CLIOptions: harness.CLIOptions{ModelURL: "127.0.0.1:9"}}, `opencode: model_url "127.0.0.1:9" is not an http(s) URL`},
		{Options{OpenCode: "oc", CLIOptions: harness.CLIOptions{ModelURL: "http://h", Env: map[string]string{"A=B": "1"}}}, `opencode: env name "A=B" is not a variable name`},
		{Options{OpenCode: "oc", CLIOptions: harness.CLIOptions{ModelURL: "http://h", Timeout: "soon"}}, `opencode: timeout "soon": time: invalid duration "soon"`},
	} {
		if _, err := New(c.opt); err == nil || err.Error() != c.want {
			t.Errorf("New(%+v): %v, want %q", c.opt, err, c.want)
		}
	}
	a, err := New(Options{OpenCode: "oc", CLIOptions: harness.CLIOptions{ModelURL: "http://h"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.opt.Model != "policy" || a.opt.APIKey != "none" || a.opt.ContextWindow != 128000 || a.opt.OutputTokens != 4096 ||
		string(a.opt.Permission) != `"allow"` || !a.PausesAtCheckpoints() {
		t.Errorf("defaults %+v", a.opt)
	}
}
