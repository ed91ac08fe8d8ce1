package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// sectionOptions stands for a backend's Options: tagged keys, a key only
// a program sets, a duration, a pointer, and an embedded struct whose
// keys are the section's too.
type sectionOptions struct {
	Name    string            `json:"name"`
	Args    []string          `json:"args"`
	UID     *int              `json:"uid"`
	Wait    time.Duration     `json:"wait"`
	Labels  map[string]string `json:"labels"`
	Program string            `json:"-"`
	Untaged string
	embedded
}

type embedded struct {
	Base string `json:"base"`
}

// TestDecodeSection: a section is read into its options by their json
// names, an embedded struct's too, a duration from "1m30s"; null leaves a
// field as it is.
func TestDecodeSection(t *testing.T) {
	var o sectionOptions
	o.Name = "kept"
	err := DecodeSection(map[string]any{"args": []any{"-H", "x"}, "uid": 0, "wait": "1m30s",
		"labels": map[string]any{"a": "b"}, "base": "/b", "name": nil}, &o, "backends.x")
	if err != nil {
		t.Fatal(err)
	}
	if o.Name != "kept" || len(o.Args) != 2 || o.UID == nil || *o.UID != 0 || o.Wait != 90*time.Second ||
		o.Labels["a"] != "b" || o.Base != "/b" {
		t.Errorf("read %+v", o)
	}
	if err := DecodeSection(nil, &o, "backends.x"); err != nil {
		t.Errorf("no section: %v", err)
	}
}

// TestDecodeSectionRefuses: a key the options do not take (one only a
// program sets, an untagged field, a name in another case), a value of
// the wrong type and a duration that is not one are each refused on one
// line naming the section and the key.
func TestDecodeSectionRefuses(t *testing.T) {
	for _, c := range []struct {
		section map[string]any
		words   []string
	}{
		{map[string]any{"nmae": "x"}, []string{"backends.x.nmae", "unknown key", "args, base, labels, name, uid, wait"}},
		{map[string]any{"Program": "x"}, []string{"backends.x.Program", "unknown key"}},
		{map[string]any{"Untaged": "x"}, []string{"backends.x.Untaged", "unknown key"}},
		{map[string]any{"Name": "x"}, []string{"backends.x.Name", "unknown key"}},
		{map[string]any{"name": 3}, []string{"backends.x.name", "want a string", "3"}},
		{map[string]any{"uid": "root"}, []string{"backends.x.uid", "whole number", `"root"`}},
		{map[string]any{"args": "-H"}, []string{"backends.x.args", "want a list"}},
		{map[string]any{"wait": "soon"}, []string{"backends.x.wait", `"soon"`, "duration like 30s"}},
		{map[string]any{"wait": 30}, []string{"backends.x.wait", "30", "duration like 30s"}},
		{map[string]any{"wait": "-5s"}, []string{"backends.x.wait", `"-5s"`}},
	} {
		var o sectionOptions
		err := DecodeSection(c.section, &o, "backends.x")
		for _, w := range c.words {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v, want an error naming %q", c.section, err, w)
			}
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: the error takes more than one line: %q", c.section, err)
		}
	}
	if err := DecodeSection(map[string]any{"a": 1}, sectionOptions{}, "x"); err == nil {
		t.Error("reading into a struct value (not a pointer) did not fail")
	}
}

// TestBackendSections: config.Backends is keyed by the names of the
// backends built in: a name not among them, a section that is not a
// mapping, a key its options do not take and a value its check refuses
// are each refused on one line naming the line (where the file has one),
// the key and, for a name, the backends there are; a null section is
// none.
func TestBackendSections(t *testing.T) {
	known := builtIn
	known.Backends = BackendKinds{
		"local": KindOf(func(s *localSection) error {
			if s.Isolation == "chroot" {
				return errInvalidIsolation
			}
			return nil
		}),
		"docker": KindOf[struct {
			Image string        `json:"image"`
			Wait  time.Duration `json:"wait"`
		}](nil),
	}
	cfg := Default()
	if err := Parse([]byte("backends:\n  local:\n    base: /b\n  docker:\n    image: x\n    wait: 1m\n"), &cfg, known); err != nil {
		t.Fatal(err)
	}
	if cfg.Backends["local"]["base"] != "/b" || cfg.Backends["docker"]["image"] != "x" {
		t.Errorf("backends %v", cfg.Backends)
	}
	cfg = Default()
	if err := Parse([]byte("backends:\n  docker:\n"), &cfg, known); err != nil || cfg.Backends["docker"] != nil {
		t.Errorf("a null section: %v, %v", cfg.Backends, err)
	}
	for _, c := range []struct {
		doc   string
		words []string
	}{
		{"backends:\n  dockr:\n    image: x\n", []string{"line 2", "backends.dockr", "unknown backend", "docker, local"}},
		{"backends:\n  docker: x\n", []string{"line 2", "backends.docker", "want a mapping"}},
		{"backends:\n  docker:\n    image: x\n    imagee: y\n", []string{"line 4", "backends.docker.imagee", "unknown key", "image, wait"}},
		{"backends:\n  docker:\n    wait: soon\n", []string{"backends.docker.wait", `"soon"`}},
		{"backends:\n  local:\n    isolation: chroot\n", []string{"backends.local.isolation", "chroot"}},
	} {
		cfg := Default()
		err := Parse([]byte(c.doc), &cfg, known)
		for _, w := range c.words {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want an error naming %q", c.doc, err, w)
			}
		}
	}
	cfg = Default()
	cfg.Backends = Backends{"dockr": nil}
	if err := cfg.Validate(known); err == nil || !strings.Contains(err.Error(), "dockr") || !strings.Contains(err.Error(), "docker, local") {
		t.Errorf("a backend not built in, set by a program: %v", err)
	}
}

var errInvalidIsolation = errors.New(`isolation "chroot": want auto, namespace or none`)
