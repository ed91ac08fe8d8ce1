package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// builtIn stands for the adapter and backend tables of cmd/ngdriver.
var builtIn = Known{
	Adapters: Adapters{"fake": {}, "opencode": {Binary: "opencode", Model: true}, "codex": {Binary: "codex", Model: true}},
	Backends: BackendKinds{"local": KindOf[localSection](nil)},
}

// localSection stands for the local backend's section.
type localSection struct {
	Base       string `json:"base"`
	MountPoint string `json:"mount_point"`
	Isolation  string `json:"isolation"`
}

// TestExampleLoads: examples/ngdriver.yaml, every key documented there,
// is a valid config (lease_grace included).
func TestExampleLoads(t *testing.T) {
	cfg, err := Load(filepath.Join("..", "..", "..", "examples", "ngdriver.yaml"), builtIn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LeaseGrace.D() != 600*time.Second || cfg.Owner.URL == "" {
		t.Errorf("lease_grace %v, owner %q", cfg.LeaseGrace.D(), cfg.Owner.URL)
	}
}

// TestLeaseGraceDefault: a file that does not say lease_grace gets Gym's
// default, 600 s; one that does gets its value.
func TestLeaseGraceDefault(t *testing.T) {
	cfg := Default()
	if err := Parse([]byte("max_runs: 2\n"), &cfg, builtIn); err != nil || cfg.LeaseGrace.D() != 600*time.Second {
		t.Errorf("default: %v, %v", cfg.LeaseGrace.D(), err)
	}
	cfg = Default()
	if err := Parse([]byte("lease_grace: 90s\n"), &cfg, builtIn); err != nil || cfg.LeaseGrace.D() != 90*time.Second {
		t.Errorf("set: %v, %v", cfg.LeaseGrace.D(), err)
	}
}

// TestAdapterSections: every built-in adapter can be selected and has its
// section under its own name (`adapter: codex` was refused once, though
// codex was built in), an empty section is no section, and an adapter
// added to the table needs no change here to get one.
func TestAdapterSections(t *testing.T) {
	cfg := Default()
	doc := `adapter: codex
fake:
opencode:
  opencode: /opt/opencode
  context_window: 8192
codex:
  codex: /opt/codex
  model_url: http://127.0.0.1:8000
`
	if err := Parse([]byte(doc), &cfg, builtIn); err != nil {
		t.Fatal(err)
	}
	if cfg.Adapter != "codex" || cfg.Sections["codex"]["codex"] != "/opt/codex" ||
		cfg.Sections["codex"]["model_url"] != "http://127.0.0.1:8000" ||
		cfg.Sections["opencode"]["context_window"] != 8192 || len(cfg.Sections["fake"]) != 0 {
		t.Errorf("adapter %q, sections %v", cfg.Adapter, cfg.Sections)
	}
	withClaude := Adapters{"claude": {Binary: "claude", Model: true}}
	for n, k := range builtIn.Adapters {
		withClaude[n] = k
	}
	cfg = Default()
	if err := Parse([]byte("adapter: claude\nclaude:\n  claude: /opt/claude\n"), &cfg, Known{Adapters: withClaude}); err != nil ||
		cfg.Sections["claude"]["claude"] != "/opt/claude" {
		t.Errorf("a fifth adapter's section: %v, %v", cfg.Sections, err)
	}
}

// TestUnknownKeys: a key that is neither a setting nor a built-in
// adapter's section, a section that is not a mapping, an adapter not
// built in and a typo inside a setting are each refused on one line
// naming them.
func TestUnknownKeys(t *testing.T) {
	for _, c := range []struct {
		doc   string
		words []string
	}{
		{"max_runs: 2\nmax_runz: 4\n", []string{"line 2", "max_runz", "unknown key", "codex, fake, opencode"}},
		{"opencod:\n  model: m\n", []string{"line 1", "opencod", "unknown key"}},
		{"claude:\n  claude: /opt/claude\n", []string{"claude", "unknown key"}},
		{"codex: /opt/codex\n", []string{"line 1", "codex", "want a mapping"}},
		{"adapter: claude\n", []string{"adapter", "claude", "codex, fake, opencode"}},
		{"owner:\n  urll: http://x\n", []string{"line 2", "urll"}},
		{"listen: [\n", []string{"line"}},
	} {
		cfg := Default()
		err := Parse([]byte(c.doc), &cfg, builtIn)
		if err == nil {
			t.Errorf("%q: no error", c.doc)
			continue
		}
		for _, w := range c.words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: the error %q does not name %q", c.doc, err, w)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: the error takes more than one line: %q", c.doc, err)
		}
	}
}
