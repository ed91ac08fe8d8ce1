// Package config is ngdriver's YAML configuration: one file, documented by
// examples/ngdriver.yaml, with unknown keys rejected by name so a typo never
// silently falls back to a default. Flags override what the file says.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole configuration of `ngdriver serve` (and the parts of
// `ngdriver owner serve` it shares).
type Config struct {
	// Listen is the address the driver serves on; empty or unset is the
	// default, 127.0.0.1:8090 (loopback: only this host reaches it).
	Listen string `yaml:"listen"`
	// Name names this participant in the checkpoint records it writes.
	Name string `yaml:"name"`
	// Token authenticates the checkpoint control plane; TokenEnv names an
	// environment variable holding it instead.
	Token    string `yaml:"token"`
	TokenEnv string `yaml:"token_env"`
	// LeaseGrace is how long past a control call's deadline the
	// participant stays closed without hearing from the controller before
	// it resumes on its own (Gym's checkpoint.lease_grace_seconds).
	LeaseGrace Duration `yaml:"lease_grace"`
	// MaxRuns bounds the runs in flight (0: no limit).
	MaxRuns int `yaml:"max_runs"`
	// Adapter names the harness adapter: one of the adapters built in
	// (the Adapters given to Parse).
	Adapter string `yaml:"adapter"`
	// PauseAtCheckpoints: false stops and relaunches at every checkpoint
	// instead of pausing in place. Unset: the adapter's own default.
	PauseAtCheckpoints *bool `yaml:"pause_at_checkpoints"`
	// StopGrace is the SIGINT-to-SIGKILL grace of a stop.
	StopGrace Duration `yaml:"stop_grace"`
	// ShutdownTimeout bounds a graceful shutdown (SIGTERM).
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// NgsupDir holds ngsup-linux-amd64 and ngsup-linux-arm64.
	NgsupDir string `yaml:"ngsup_dir"`
	// LogFormat is json, text, or auto (json unless stderr is a terminal).
	LogFormat string `yaml:"log_format"`
	// Owner is how to reach the sandbox owner.
	Owner Owner `yaml:"owner"`
	// Backends configures the sandbox backends: each one's section by
	// its name.
	Backends Backends `yaml:"backends"`
	// Sections holds each adapter's own settings, by the adapter's name:
	// a top-level key that is none of the fields above (`fake:`,
	// `opencode:`, `codex:`, ...). Only the adapter Adapter names reads
	// its section; each built-in adapter may have one.
	Sections map[string]map[string]any `yaml:",inline"`
}

// Adapters is what the configuration knows of the adapters built into an
// ngdriver, by name: the names `adapter` may take and the sections a file
// may hold.
type Adapters map[string]AdapterKeys

// AdapterKeys says which of the keys common to harness adapters one
// adapter's section takes.
type AdapterKeys struct {
	// Binary is the section's key naming the harness binary as the
	// sandbox sees it ("" when the adapter has none).
	Binary string
	// Model: the harness calls a model server, and the section takes
	// model_url (the server's base URL) and model (the served model).
	Model bool
	// Gym maps keys of Gym's own agent for the harness (its OpenCode
	// agent's, for opencode), when they stand in the stanza of the agent
	// a Gym config runs ngdriver as, onto keys of the section
	// (gymconfig); other adapters ignore them.
	Gym []GymKey
}

// GymKey maps one key of a Gym agent's stanza onto a key of an adapter's
// section: a Gym config fills the section's key from it unless the
// ngdriver block's section sets that key.
type GymKey struct {
	// Gym is the key in the stanza; a dotted path (a.b) is key b of the
	// mapping a, whose other keys are then reported as ignored.
	Gym string
	// Ours is the section's key it fills.
	Ours string
	// As is how the value is read.
	As GymValue
}

// GymValue is how a GymKey's value is read.
type GymValue int

const (
	// GymString is a single value, taken as written.
	GymString GymValue = iota
	// GymCount is a positive whole number (a token count).
	GymCount
	// GymSeconds is a positive number of seconds, written into the
	// section as a duration ("3h0m0s").
	GymSeconds
	// GymAny is any value (a mapping too), taken as it is.
	GymAny
)

// Names lists the adapters, sorted and comma-separated, for messages.
func (k Adapters) Names() string {
	names := make([]string, 0, len(k))
	for n := range k {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// ownKeys are the top-level keys of a file that are Config's own fields.
var ownKeys = func() map[string]bool {
	m := map[string]bool{}
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name != "" {
			m[name] = true
		}
	}
	return m
}()

// CheckSections checks the keys of n, the mapping at the top of a
// config, that are none of Config's own: each must be the section of an
// adapter in k, and a mapping. at prefixes the keys named in errors ("" at
// a file's top).
func (k Adapters) CheckSections(n *yaml.Node, at string) error {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, v := n.Content[i], n.Content[i+1]
		if ownKeys[key.Value] {
			continue
		}
		if _, ok := k[key.Value]; !ok {
			return fmt.Errorf("line %d: %s%s: unknown key (neither a setting nor the section of an adapter built in: %s)",
				key.Line, at, key.Value, k.Names())
		}
		if v.Kind != yaml.MappingNode && v.Tag != "!!null" {
			return fmt.Errorf("line %d: %s%s: want a mapping (the %s adapter's settings)", v.Line, at, key.Value, key.Value)
		}
	}
	return nil
}

// Owner is the sandbox owner's address and call budgets.
type Owner struct {
	URL           string   `yaml:"url"`
	Timeout       Duration `yaml:"timeout"`
	VerifyTimeout Duration `yaml:"verify_timeout"`
	Retries       int      `yaml:"retries"`
}

// Backends holds each sandbox backend's section, by the backend's name
// (its provider name: `local:`, `docker:`, ...). A name must be one of
// the backends built in (Known.Backends), and a section is read into that
// backend's options by DecodeSection. A section that is null is none.
type Backends map[string]map[string]any

// Known is what the configuration knows of what is built into an
// ngdriver: the adapters and the sandbox backends, each by name. The
// tables themselves are cmd/ngdriver's (adapters.go, backends.go); a file
// is checked against them.
type Known struct {
	Adapters Adapters
	Backends BackendKinds
}

// BackendKinds is what the configuration knows of the sandbox backends
// built in, by name: the section each takes.
type BackendKinds map[string]BackendKind

// BackendKind is one backend's section: the options it is read into and
// the values checked before anything is built. Make one with KindOf.
type BackendKind struct {
	// options makes a new pointer to what the section is read into.
	options func() any
	// check checks the values of a section read into options.
	check func(any) error
}

// KindOf is the kind of a backend whose section is read into O (its
// Options, or a struct embedding them with the keys only a file has):
// O's json tags are the section's keys. check, when not nil, refuses the
// values a file could get wrong beyond their type (a choice among names),
// before anything is built; its error starts with the key it is about
// (`isolation "chroot": want ...`), which Read puts after the section's
// path.
func KindOf[O any](check func(*O) error) BackendKind {
	return BackendKind{
		options: func() any { return new(O) },
		check: func(o any) error {
			if check == nil {
				return nil
			}
			return check(o.(*O))
		},
	}
}

// Names lists the backends, sorted and comma-separated, for messages.
func (k BackendKinds) Names() string {
	return strings.Join(slices.Sorted(maps.Keys(k)), ", ")
}

// Read reads section, the section of backend name, into a new value of
// its options and checks it: a *O when the kind is KindOf[O].
func (k BackendKinds) Read(name string, section map[string]any) (any, error) {
	kind, ok := k[name]
	if !ok {
		return nil, fmt.Errorf("backends.%s: no backend of that name is built in (it has %s)", name, k.Names())
	}
	return kind.Read(name, section)
}

// Read reads section, the section of backend name (its key under
// backends), into a new value of the kind's options with DecodeSection
// and checks it: a *O when the kind is KindOf[O].
func (k BackendKind) Read(name string, section map[string]any) (any, error) {
	o := k.options()
	if err := DecodeSection(section, o, "backends."+name); err != nil {
		return nil, err
	}
	if err := k.check(o); err != nil {
		return nil, fmt.Errorf("backends.%s.%w", name, err)
	}
	return o, nil
}

// CheckSections checks the backends key of n, the mapping at the top of a
// config: each key under it must name a backend in k and hold a mapping
// (or null) of keys its options take. at prefixes the keys named in errors
// ("" at a file's top).
func (k BackendKinds) CheckSections(n *yaml.Node, at string) error {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value != "backends" || n.Content[i+1].Kind != yaml.MappingNode {
			continue
		}
		b := n.Content[i+1]
		for j := 0; j+1 < len(b.Content); j += 2 {
			key, v := b.Content[j], b.Content[j+1]
			kind, ok := k[key.Value]
			switch {
			case !ok:
				return fmt.Errorf("line %d: %sbackends.%s: unknown backend (built in: %s)", key.Line, at, key.Value, k.Names())
			case v.Tag == "!!null":
			case v.Kind != yaml.MappingNode:
				return fmt.Errorf("line %d: %sbackends.%s: want a mapping (the %s backend's settings)", v.Line, at, key.Value, key.Value)
			default:
				if err := checkSectionKeys(v, reflect.TypeOf(kind.options()).Elem(), at+"backends."+key.Value); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Duration is a time.Duration written as "10s" in YAML.
type Duration time.Duration

// UnmarshalYAML reads "10s", "1m30s" and the like.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a duration like 10s", n.Line)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("line %d: %q is not a duration like 10s", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// D returns the duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Default is the configuration when a file says nothing.
func Default() Config {
	return Config{
		Listen:          "127.0.0.1:8090",
		Name:            "ngdriver",
		TokenEnv:        "NG_CONTROL_TOKEN",
		LeaseGrace:      Duration(600 * time.Second),
		MaxRuns:         64,
		Adapter:         "fake",
		StopGrace:       Duration(10 * time.Second),
		ShutdownTimeout: Duration(60 * time.Second),
		LogFormat:       "auto",
		Owner:           Owner{Timeout: Duration(60 * time.Second), VerifyTimeout: Duration(30 * time.Minute), Retries: 3},
	}
}

// Load reads path over the defaults; known is what is built in. Unknown
// keys are an error naming them.
func Load(path string, known Known) (Config, error) {
	cfg := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read config: %w", err)
	}
	if err := Parse(data, &cfg, known); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse reads YAML into cfg strictly: a key that is neither a setting nor
// the section of an adapter in known, a backend not in known or a key its
// section does not take is an error naming it.
func Parse(data []byte, cfg *Config, known Known) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return oneLine(err)
	}
	if len(doc.Content) > 0 {
		if err := known.Adapters.CheckSections(doc.Content[0], ""); err != nil {
			return err
		}
		if err := known.Backends.CheckSections(doc.Content[0], ""); err != nil {
			return err
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	// An empty file decodes to io.EOF: the defaults stand.
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return oneLine(err)
	}
	return cfg.Validate(known)
}

// oneLine is a YAML error on one line.
func oneLine(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return errors.New(strings.Join(strings.Fields(strings.ReplaceAll(msg, "\n", "; ")), " "))
}

// Validate checks values a file could get wrong; known is what is built
// in. Each backend's section is read into its options and checked.
func (c *Config) Validate(known Known) error {
	if _, ok := known.Adapters[c.Adapter]; !ok {
		return fmt.Errorf("adapter %q is not built into this ngdriver (it has %s)", c.Adapter, known.Adapters.Names())
	}
	for name := range c.Sections {
		if _, ok := known.Adapters[name]; !ok {
			return fmt.Errorf("%s: no adapter of that name is built in (it has %s)", name, known.Adapters.Names())
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Backends)) {
		if _, err := known.Backends.Read(name, c.Backends[name]); err != nil {
			return err
		}
	}
	switch c.LogFormat {
	case "auto", "json", "text":
	default:
		return fmt.Errorf("log_format %q: want auto, json or text", c.LogFormat)
	}
	if c.MaxRuns < 0 {
		return fmt.Errorf("max_runs %d is negative", c.MaxRuns)
	}
	return nil
}

// ControlToken returns the token: the file's, else the named environment
// variable's.
func (c *Config) ControlToken() string {
	if c.Token != "" {
		return c.Token
	}
	if c.TokenEnv != "" {
		return os.Getenv(c.TokenEnv)
	}
	return ""
}
