package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/config"
)

// TestCodexAdapterEntry: the adapter table builds the Codex adapter from
// the config's codex section, and refuses a section with an unknown key or
// without the binary, naming what is wrong.
func TestCodexAdapterEntry(t *testing.T) {
	a, err := buildAdapter(config.Config{Adapter: "codex", Sections: map[string]map[string]any{"codex": {
		"codex": "/opt/codex", "model_url": "http://127.0.0.1:8000", "model": "m", "timeout": "1h"}}})
	if err != nil || a.Name() != "codex" {
		t.Fatalf("built %v, %v; want the codex adapter", a, err)
	}
	for _, c := range []struct {
		section map[string]any
		want    string
	}{
		{map[string]any{"codex": "/opt/codex", "model_url": "http://x", "modle": "m"}, "modle"},
		{map[string]any{"model_url": "http://x"}, "codex.codex"},
		{map[string]any{"codex": "/opt/codex", "model_url": "http://x", "timeout": "soon"}, "timeout"},
	} {
		_, err := buildAdapter(config.Config{Adapter: "codex", Sections: map[string]map[string]any{"codex": c.section}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("section %v: %v, want an error naming %q", c.section, err, c.want)
		}
	}
	if _, err := buildAdapter(config.Config{Adapter: "nope"}); err == nil || !strings.Contains(err.Error(), "codex") {
		t.Errorf("an unknown adapter: %v, want the list naming codex", err)
	}
}

// TestCodexConfigFile: a serve config file selecting codex, with its
// codex: section, loads and builds the Codex adapter (it was refused
// once: the config accepted only fake and opencode).
func TestCodexConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ngdriver.yaml")
	doc := "adapter: codex\ncodex:\n  codex: /opt/codex\n  model_url: http://127.0.0.1:8000\n  resume_prompt: Continue.\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, builtIn())
	if err != nil {
		t.Fatal(err)
	}
	if a, err := buildAdapter(cfg); err != nil || a.Name() != "codex" {
		t.Errorf("built %v, %v; want the codex adapter", a, err)
	}
}

// TestDocsListTheAdapters: examples/ngdriver.yaml holds a section
// (commented) for each adapter of the table, and examples/gym/README.md
// has a line for each key an adapter maps from Gym's own agent, naming
// the section's key it fills.
func TestDocsListTheAdapters(t *testing.T) {
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "ngdriver.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(t, uncommentKeys.ReplaceAllString(string(example), "$1$2"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "examples", "gym", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(readme), "\n")
	for name, a := range adapters {
		if _, ok := cfg.Sections[name]; !ok {
			t.Errorf("examples/ngdriver.yaml has no section for the %s adapter", name)
		}
		for _, k := range a.keys.Gym {
			if !slices.ContainsFunc(lines, func(l string) bool {
				return strings.HasPrefix(l, "| `"+k.Gym+"`") && strings.Contains(l, "`"+name+"."+k.Ours+"`")
			}) {
				t.Errorf("examples/gym/README.md has no line mapping %s to %s.%s", k.Gym, name, k.Ours)
			}
		}
	}
}

// TestPiAdapterEntry: the adapter table builds the Pi adapter from the
// config's pi section (its pi command, node, the model keys), and refuses
// a section with an unknown key or without the pi command, naming what is
// wrong.
func TestPiAdapterEntry(t *testing.T) {
	a, err := buildAdapter(config.Config{Adapter: "pi", Sections: map[string]map[string]any{"pi": {
		"pi": "/opt/pi/node_modules/.bin/pi", "node": "/usr/bin/node", "model_url": "http://127.0.0.1:8000", "model": "m", "timeout": "1h"}}})
	if err != nil || a.Name() != "pi" {
		t.Fatalf("built %v, %v; want the pi adapter", a, err)
	}
	for _, c := range []struct {
		section map[string]any
		want    string
	}{
		{map[string]any{"pi": "/opt/pi", "model_url": "http://x", "nod": "node"}, "nod"},
		{map[string]any{"model_url": "http://x"}, "pi.pi"},
		{map[string]any{"pi": "/opt/pi", "model_url": "ftp://x"}, "model_url"},
	} {
		_, err := buildAdapter(config.Config{Adapter: "pi", Sections: map[string]map[string]any{"pi": c.section}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("section %v: %v, want an error naming %q", c.section, err, c.want)
		}
	}
}
