// Package config is ngdriver's YAML configuration: one file, documented by
// examples/ngdriver.yaml, with unknown keys rejected by name so a typo never
// silently falls back to a default. Flags override what the file says.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole configuration of `ngdriver serve` (and the parts of
// `ngdriver owner serve` it shares).
type Config struct {
	// Listen is the address the driver serves on.
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
	// Adapter names the harness adapter: fake, opencode or codex.
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
	// Backends configures the sandbox backends.
	Backends Backends `yaml:"backends"`
	// Fake configures the fake adapter.
	Fake map[string]any `yaml:"fake"`
	// OpenCode configures the OpenCode adapter.
	OpenCode map[string]any `yaml:"opencode"`
	// Codex configures the Codex CLI adapter.
	Codex map[string]any `yaml:"codex"`
}

// Owner is the sandbox owner's address and call budgets.
type Owner struct {
	URL           string   `yaml:"url"`
	Timeout       Duration `yaml:"timeout"`
	VerifyTimeout Duration `yaml:"verify_timeout"`
	Retries       int      `yaml:"retries"`
}

// Backends holds each backend's settings.
type Backends struct {
	Local       *Local         `yaml:"local"`
	OpenSandbox map[string]any `yaml:"opensandbox"`
	Docker      map[string]any `yaml:"docker"`
	Kubectl     map[string]any `yaml:"kubectl"`
}

// Local configures the local backend.
type Local struct {
	Base       string `yaml:"base"`
	MountPoint string `yaml:"mount_point"`
	Isolation  string `yaml:"isolation"`
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

// Load reads path over the defaults. Unknown keys are an error naming them.
func Load(path string) (Config, error) {
	cfg := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read config: %w", err)
	}
	if err := Parse(data, &cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse reads YAML into cfg strictly.
func Parse(data []byte, cfg *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	// An empty file decodes to io.EOF: the defaults stand.
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		return errors.New(strings.Join(strings.Fields(strings.ReplaceAll(msg, "\n", "; ")), " "))
	}
	return cfg.Validate()
}

// Validate checks values a file could get wrong.
func (c *Config) Validate() error {
	switch c.Adapter {
	case "fake", "opencode":
	default:
		return fmt.Errorf("adapter %q: want fake or opencode", c.Adapter)
	}
	switch c.LogFormat {
	case "auto", "json", "text":
	default:
		return fmt.Errorf("log_format %q: want auto, json or text", c.LogFormat)
	}
	if c.MaxRuns < 0 {
		return fmt.Errorf("max_runs %d is negative", c.MaxRuns)
	}
	if c.Backends.Local != nil {
		switch c.Backends.Local.Isolation {
		case "", "auto", "namespace", "none":
		default:
			return fmt.Errorf("backends.local.isolation %q: want auto, namespace or none", c.Backends.Local.Isolation)
		}
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
