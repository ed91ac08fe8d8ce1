package main

import (
	"os"
	"path/filepath"
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
