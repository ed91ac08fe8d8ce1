package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/config"
)

// loadConfig writes doc to a file and loads it as `ngdriver serve
// --config` does.
func loadConfig(t *testing.T, doc string) (config.Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ngdriver.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return config.Load(path, builtIn())
}

// TestEveryBackendBuildsFromItsSection: each backend of the table, local
// among them, is built from its section of one config file, by its name.
func TestEveryBackendBuildsFromItsSection(t *testing.T) {
	cfg, err := loadConfig(t, `backends:
  local: {base: `+t.TempDir()+`, isolation: none}
  opensandbox: {server: "http://127.0.0.1:1", ttl: 2h, uid: 1000}
  docker: {binary: /bin/true, image: "img:1"}
  kubectl: {binary: /bin/true, ready_timeout: 1m, snapshot_dir: /tmp}
`)
	if err != nil {
		t.Fatal(err)
	}
	built, err := buildBackends(cfg.Backends)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range built {
		names = append(names, name)
	}
	slices.Sort(names)
	if want := []string{"docker", "kubectl", "local", "opensandbox"}; !slices.Equal(names, want) {
		t.Errorf("built %v, want %v", names, want)
	}
	if len(backends) != len(names) {
		t.Errorf("the table has %d backends, the config built %d", len(backends), len(names))
	}
}

// TestBackendSectionErrors: a backend the table does not have, and a key
// a backend's section does not take, are refused when the config loads
// (not when the backend is first built), on one line naming the line, the
// key and the file, and for a name the backends there are.
func TestBackendSectionErrors(t *testing.T) {
	for _, c := range []struct {
		doc   string
		words []string
	}{
		{"backends:\n  dockr:\n    image: x\n", []string{"line 2", "dockr", "docker, kubectl, local, opensandbox"}},
		{"backends:\n  docker:\n    imagee: x\n", []string{"line 3", "backends.docker.imagee", "unknown key"}},
		{"backends:\n  opensandbox:\n    server: http://x\n    ttl: soon\n", []string{"backends.opensandbox.ttl", `"soon"`}},
		{"backends:\n  kubectl:\n    ready_timeout: -1m\n", []string{"backends.kubectl.ready_timeout", `"-1m"`}},
		{"backends:\n  local:\n    base: /b\n    isolation: chroot\n", []string{"backends.local.isolation", "chroot", "want auto, namespace or none"}},
	} {
		_, err := loadConfig(t, c.doc)
		for _, w := range c.words {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want an error naming %q", c.doc, err, w)
			}
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: the error takes more than one line: %q", c.doc, err)
		}
	}
}

// TestOwnerServeHelpListsTheTable: `ngdriver owner serve --backend`'s help
// names every backend of the table, and each one an owner lends from a
// config's section.
func TestOwnerServeHelpListsTheTable(t *testing.T) {
	serve, _, err := newOwnerCmd().Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	usage := serve.Flags().Lookup("backend").Usage
	for _, b := range backends {
		if !strings.Contains(usage, b.name) {
			t.Errorf("--backend's help %q does not name %s", usage, b.name)
		}
		if b.name != "local" && !strings.Contains(serve.Long, b.name) {
			t.Errorf("owner serve's help does not say what --backend %s lends", b.name)
		}
	}
}

// TestDocsListTheBackends: docs/driver.md lists the backends of the
// table, in its order, and examples/ngdriver.yaml holds a section
// (commented) for each.
func TestDocsListTheBackends(t *testing.T) {
	var names []string
	for _, b := range backends {
		names = append(names, b.name)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "driver.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`A backend reaches sandboxes of one provider \(([^)]*)\)`).FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/driver.md no longer says which providers there are")
	}
	var listed []string
	for _, n := range regexp.MustCompile("`([a-z]+)`").FindAllSubmatch(m[1], -1) {
		listed = append(listed, string(n[1]))
	}
	if !slices.Equal(listed, names) {
		t.Errorf("docs/driver.md lists %v, the table has %v", listed, names)
	}
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "ngdriver.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(t, uncommentKeys.ReplaceAllString(string(example), "$1$2"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if _, ok := cfg.Backends[name]; !ok {
			t.Errorf("examples/ngdriver.yaml has no section for the %s backend", name)
		}
	}
}
