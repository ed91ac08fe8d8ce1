package main

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/config"
	"github.com/ngharness/ngharness/pkg/driver/config/gymconfig"
)

var update = flag.Bool("update", false, "rewrite testdata/examples.golden.json from what the examples load to")

// uncommentKeys uncomments every commented line of a YAML file that is
// a key (`  # docker:`, `#   image: x`): the example's optional sections
// as a user writes them in.
var uncommentKeys = regexp.MustCompile(`(?m)^(\s*)# (\s*[a-z_]+:.*)$`)

// TestExampleConfigsLoadTheSame: examples/ngdriver.yaml as shipped, the
// same with every commented section written in (every backend's and every
// adapter's keys), testdata/every-key.yaml (every backend key set) and
// examples/gym's stanza load to the values recorded
// in testdata/examples.golden.json: every setting, and each backend's and
// adapter's section as its own options read it, by key, zero values too.
// A key that a section stops (or starts) taking, or a value read
// differently, changes the figures: the file users write keeps its
// meaning.
func TestExampleConfigsLoadTheSame(t *testing.T) {
	t.Setenv("OPEN_SANDBOX_API_KEY", "")
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "ngdriver.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	everyKey, err := os.ReadFile(filepath.Join("testdata", "every-key.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	got := map[string]any{}
	for name, doc := range map[string]string{
		"ngdriver.yaml":          string(example),
		"ngdriver.yaml, written": uncommentKeys.ReplaceAllString(string(example), "$1$2"),
		"every-key.yaml":         string(everyKey),
	} {
		path := filepath.Join(dir, "ngdriver.yaml")
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path, builtIn())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got[name] = loaded(t, cfg)
	}

	gym, err := os.ReadFile(filepath.Join("..", "..", "examples", "gym", "responses_api_agents", "ngdriver_agent", "configs", "ngdriver_agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(gym), "      entrypoint: app.py\n", "      entrypoint: app.py\n      host: 127.0.0.1\n      port: 15001\n", 1) +
		"swebench_resources_server:\n  resources_servers:\n    swebench: {entrypoint: app.py, host: 127.0.0.1, port: 15002}\n" +
		"policy_model:\n  responses_api_models:\n    vllm_model: {entrypoint: app.py, host: 127.0.0.1, port: 15003}\n"
	t.Setenv("NG_CONTROL_TOKEN", "example-token")
	s, err := gymconfig.Parse([]byte(doc), "ngdriver_agent", builtIn())
	if err != nil {
		t.Fatal(err)
	}
	got["gym ngdriver_agent.yaml"] = loaded(t, s.Config)
	got["gym ngdriver_agent.yaml, ignored"] = s.Ignored

	data, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "examples.golden.json")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, append(data, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(want)) != string(data) {
		t.Errorf("the examples load to other values than %s; got:\n%s", golden, data)
	}
}

// loaded is what cfg means, by key: its settings (backends and adapter
// sections aside), each backend's section as the backend reads it, and
// each adapter's section as the adapter reads it.
func loaded(t *testing.T, cfg config.Config) map[string]any {
	t.Helper()
	settings := byKey(reflect.ValueOf(cfg)).(map[string]any)
	delete(settings, "backends")
	backends, err := decodedBackends(cfg.Backends)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	for name, sec := range cfg.Sections {
		row, ok := adapters[name]
		if !ok || row.options == nil {
			t.Fatalf("the adapter table has no options for the section %s", name)
		}
		opt := row.options()
		if err := decodeAdapterSection(sec, opt, name); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = byKey(reflect.ValueOf(opt))
	}
	return map[string]any{"settings": settings, "backends": backends, "adapters": out}
}

// decodedBackends reads each configured backend's section as the backend
// does, by key.
func decodedBackends(b config.Backends) (map[string]any, error) {
	out := map[string]any{}
	for name, section := range b {
		o, err := backendKinds().Read(name, section)
		if err != nil {
			return nil, err
		}
		out[name] = byKey(reflect.ValueOf(o))
	}
	return out, nil
}

// decodeAdapterSection reads an adapter's section as its build does.
func decodeAdapterSection(section map[string]any, opt any, name string) error {
	return config.DecodeSection(section, opt, name)
}

// byKey is v as the keys a file writes name it: a struct's fields by
// their yaml (else json) tag, embedded structs flattened, fields no key
// names left out; pointers followed; everything else as JSON has it.
func byKey(v reflect.Value) any {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Struct:
		out := map[string]any{}
		addFields(out, v)
		return out
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		out := map[string]any{}
		for _, k := range v.MapKeys() {
			out[k.String()] = byKey(v.MapIndex(k))
		}
		return out
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return string(v.Bytes())
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = byKey(v.Index(i))
		}
		return out
	}
	return v.Interface()
}

func addFields(out map[string]any, v reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		if tag == "" {
			tag = f.Tag.Get("json")
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			addFields(out, v.Field(i))
			continue
		}
		if !f.IsExported() || name == "" || name == "-" || opts == "inline" {
			continue
		}
		out[name] = byKey(v.Field(i))
	}
}
