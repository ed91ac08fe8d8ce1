package main

import (
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/config"
)

// TestCodexAdapterEntry: the adapter table builds the Codex adapter from
// the config's codex section, and refuses a section with an unknown key or
// without the binary, naming what is wrong.
func TestCodexAdapterEntry(t *testing.T) {
	a, err := buildAdapter(config.Config{Adapter: "codex", Codex: map[string]any{
		"codex": "/opt/codex", "model_url": "http://127.0.0.1:8000", "model": "m", "timeout": "1h"}})
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
		_, err := buildAdapter(config.Config{Adapter: "codex", Codex: c.section})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("section %v: %v, want an error naming %q", c.section, err, c.want)
		}
	}
	if _, err := buildAdapter(config.Config{Adapter: "nope"}); err == nil || !strings.Contains(err.Error(), "codex") {
		t.Errorf("an unknown adapter: %v, want the list naming codex", err)
	}
}
