package harness_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/harness"
)

// cliSection is an adapter's Options as the adapters declare them: its
// binary's key, the shared options embedded, a key of its own.
type cliSection struct {
	Bin string `json:"bin"`
	harness.CLIOptions
	Own int `json:"own"`
}

// TestCLIOptionsKeysAndCheck: the shared options keep their config keys
// beside the adapter's own (a section is read strictly, as ngdriver reads
// it); Check fills the model and key defaults, returns the timeout, and
// refuses, naming the adapter and its key, a missing binary, a model_url
// that is not http(s), an env name that is no variable name and a timeout
// that is no duration; Pauses is on unless pause_at_checkpoints is false.
func TestCLIOptionsKeysAndCheck(t *testing.T) {
	dec := json.NewDecoder(strings.NewReader(`{"bin": "/opt/x", "model_url": "http://h:1", "model": "m", "api_key": "k",
		"pause_at_checkpoints": false, "env": {"A": "1"}, "timeout": "90s", "own": 3}`))
	dec.DisallowUnknownFields()
	var sec cliSection
	if err := dec.Decode(&sec); err != nil {
		t.Fatalf("the shared keys in a section: %v", err)
	}
	if sec.Bin != "/opt/x" || sec.ModelURL != "http://h:1" || sec.Model != "m" || sec.APIKey != "k" || sec.Pauses() ||
		sec.Env["A"] != "1" || sec.Timeout != "90s" || sec.Own != 3 {
		t.Fatalf("read %+v", sec)
	}
	if d, err := sec.Check("x", sec.Bin); d != 90*time.Second || err != nil {
		t.Fatalf("Check: %v %v", d, err)
	}

	o := harness.CLIOptions{ModelURL: "https://h"}
	if d, err := o.Check("x", "/opt/x"); d != 0 || err != nil || o.Model != "policy" || o.APIKey != "none" || !o.Pauses() {
		t.Fatalf("defaults: %+v %v %v", o, d, err)
	}
	for _, c := range []struct {
		bin  string
		o    harness.CLIOptions
		want string
	}{
		{"", harness.CLIOptions{ModelURL: "http://h"}, "x: the x binary (x.x) is required"},
		{"b", harness.CLIOptions{}, "x: the model server (x.model_url) is required"},
		{"b", harness.CLIOptions{ModelURL: "127.0.0.1:9"}, `x: model_url "127.0.0.1:9" is not an http(s) URL`},
		{"b", harness.CLIOptions{ModelURL: "http://h", Env: map[string]string{"A=B": "1"}}, `x: env name "A=B" is not a variable name`},
		{"b", harness.CLIOptions{ModelURL: "http://h", Timeout: "soon"}, `x: timeout "soon": time: invalid duration "soon"`},
	} {
		if _, err := c.o.Check("x", c.bin); err == nil || err.Error() != c.want {
			t.Errorf("Check(%+v, %q): %v, want %q", c.o, c.bin, err, c.want)
		}
	}
}
