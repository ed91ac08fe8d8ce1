package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/config"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/docker"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/kubectl"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// duration reads "30s" in a backend's section.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration like 30s, got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("%q is not a duration like 30s", s)
	}
	*d = duration(v)
	return nil
}

// openSandboxConfig is backends.opensandbox.
type openSandboxConfig struct {
	// Server is the lifecycle server, e.g. http://opensandbox:8080.
	Server string `json:"server"`
	// APIKey, or the environment variable APIKeyEnv (default
	// OPEN_SANDBOX_API_KEY) holding it.
	APIKey    string `json:"api_key"`
	APIKeyEnv string `json:"api_key_env"`
	Root      string `json:"root"`
	Workdir   string `json:"workdir"`
	UID       *int   `json:"uid"`
	GID       *int   `json:"gid"`
	// UseServerProxy asks for server-proxied execd endpoints.
	UseServerProxy bool     `json:"use_server_proxy"`
	RetryFor       duration `json:"retry_for"`
	// For an owner lending OpenSandbox sandboxes.
	Image          string            `json:"image"`
	Entrypoint     []string          `json:"entrypoint"`
	TTL            duration          `json:"ttl"`
	ResourceLimits map[string]string `json:"resource_limits"`
	Env            map[string]string `json:"env"`
	Metadata       map[string]string `json:"metadata"`
}

// dockerConfig is backends.docker.
type dockerConfig struct {
	Binary  string   `json:"binary"`
	Args    []string `json:"args"`
	Env     []string `json:"env"`
	User    string   `json:"user"`
	Root    string   `json:"root"`
	Workdir string   `json:"workdir"`
	// For an owner lending containers.
	Image              string   `json:"image"`
	RunArgs            []string `json:"run_args"`
	Command            []string `json:"command"`
	SnapshotRepository string   `json:"snapshot_repository"`
	// Owner names this owner on the images it commits (label
	// io.ngharness.snapshot); it removes only unused images of its name.
	Owner string `json:"owner"`
}

// kubectlConfig is backends.kubectl.
type kubectlConfig struct {
	Binary    string   `json:"binary"`
	Args      []string `json:"args"`
	Env       []string `json:"env"`
	Namespace string   `json:"namespace"`
	Container string   `json:"container"`
	Root      string   `json:"root"`
	Workdir   string   `json:"workdir"`
	// For an owner lending pods.
	Image         string   `json:"image"`
	RunArgs       []string `json:"run_args"`
	Command       []string `json:"command"`
	ReadyTimeout  duration `json:"ready_timeout"`
	SnapshotDir   string   `json:"snapshot_dir"`
	SnapshotPaths []string `json:"snapshot_paths"`
}

func newOpenSandbox(section map[string]any) (*opensandbox.Backend, error) {
	var c openSandboxConfig
	if err := remarshal(section, &c); err != nil {
		return nil, usagef("backends.opensandbox: %v", err)
	}
	if c.Server == "" {
		return nil, usagef("backends.opensandbox.server is required (the lifecycle server, e.g. http://opensandbox:8080)")
	}
	key := c.APIKey
	if key == "" {
		env := c.APIKeyEnv
		if env == "" {
			env = "OPEN_SANDBOX_API_KEY"
		}
		key = os.Getenv(env)
	}
	return opensandbox.New(opensandbox.Options{
		Server: c.Server, APIKey: key, Root: c.Root, Workdir: c.Workdir, UID: c.UID, GID: c.GID,
		UseServerProxy: c.UseServerProxy, RetryFor: time.Duration(c.RetryFor),
		Image: c.Image, Entrypoint: c.Entrypoint, TTL: time.Duration(c.TTL),
		ResourceLimits: c.ResourceLimits, Env: c.Env, Metadata: c.Metadata,
	})
}

func newDocker(section map[string]any) (*docker.Backend, error) {
	var c dockerConfig
	if err := remarshal(section, &c); err != nil {
		return nil, usagef("backends.docker: %v", err)
	}
	return docker.New(docker.Options{
		Binary: c.Binary, Args: c.Args, Env: c.Env, User: c.User, Root: c.Root, Workdir: c.Workdir,
		Image: c.Image, RunArgs: c.RunArgs, Command: c.Command, SnapshotRepository: c.SnapshotRepository,
		Owner: c.Owner,
	})
}

func newKubectl(section map[string]any) (*kubectl.Backend, error) {
	var c kubectlConfig
	if err := remarshal(section, &c); err != nil {
		return nil, usagef("backends.kubectl: %v", err)
	}
	return kubectl.New(kubectl.Options{
		Binary: c.Binary, Args: c.Args, Env: c.Env, Namespace: c.Namespace, Container: c.Container,
		Root: c.Root, Workdir: c.Workdir, Image: c.Image, RunArgs: c.RunArgs, Command: c.Command,
		ReadyTimeout: time.Duration(c.ReadyTimeout), SnapshotDir: c.SnapshotDir, SnapshotPaths: c.SnapshotPaths,
	})
}

// remoteBackend is a backend configured by a section of its own that can
// both run the driver's commands and lend sandboxes to an owner.
type remoteBackend interface {
	sandbox.Backend
	sandbox.Lender
}

// remoteBackends is the one table of the backends beside local, in the
// order they are listed: adding one touches only here (and its section in
// config.Backends). lend, when set, checks what lending sandboxes needs
// beyond running commands in them.
var remoteBackends = []struct {
	name    string
	section func(config.Backends) map[string]any
	build   func(map[string]any) (remoteBackend, error)
	lend    func(map[string]any) error
}{
	{name: opensandbox.Name, section: func(b config.Backends) map[string]any { return b.OpenSandbox },
		build: func(s map[string]any) (remoteBackend, error) { return newOpenSandbox(s) }},
	{name: docker.Name, section: func(b config.Backends) map[string]any { return b.Docker },
		build: func(s map[string]any) (remoteBackend, error) { return newDocker(s) }},
	{name: kubectl.Name, section: func(b config.Backends) map[string]any { return b.Kubectl },
		build: func(s map[string]any) (remoteBackend, error) { return newKubectl(s) },
		lend: func(s map[string]any) error {
			if dir, _ := s["snapshot_dir"].(string); dir == "" {
				return usagef("backends.kubectl.snapshot_dir is required to lend pods (snapshots are tar files kept there)")
			}
			return nil
		}},
}

// backendNames lists local and every remote backend, for errors.
func backendNames() string {
	names := []string{"local"}
	for _, rb := range remoteBackends {
		names = append(names, rb.name)
	}
	return strings.Join(names, ", ")
}

// buildBackends makes every backend the config's backends section names,
// by provider name.
func buildBackends(b config.Backends) (map[string]sandbox.Backend, error) {
	out := map[string]sandbox.Backend{}
	if l := b.Local; l != nil {
		if l.Base == "" {
			return nil, usagef("backends.local.base is required")
		}
		lb, err := local.New(l.Base, local.Options{MountPoint: l.MountPoint, Isolation: l.Isolation})
		if err != nil {
			return nil, err
		}
		out[lb.Name()] = lb
	}
	for _, rb := range remoteBackends {
		section := rb.section(b)
		if section == nil {
			continue
		}
		be, err := rb.build(section)
		if err != nil {
			return nil, err
		}
		out[be.Name()] = be
	}
	if len(out) == 0 {
		return nil, usagef("no sandbox backend configured (a backends section for one of %s)", backendNames())
	}
	return out, nil
}

// buildLender makes the backend an owner lends sandboxes of: the section
// of the backends config named name (a remote backend).
func buildLender(b config.Backends, name string) (sandbox.Lender, error) {
	for _, rb := range remoteBackends {
		if rb.name != name {
			continue
		}
		section := rb.section(b)
		if section == nil {
			return nil, usagef("--backend %s: the config has no backends.%s section", name, name)
		}
		if img, _ := section["image"].(string); strings.TrimSpace(img) == "" {
			return nil, usagef("backends.%s.image is required to lend sandboxes", name)
		}
		be, err := rb.build(section)
		if err != nil {
			return nil, err
		}
		if rb.lend != nil {
			if err := rb.lend(section); err != nil {
				return nil, err
			}
		}
		return be, nil
	}
	return nil, usagef("--backend %q: want one of %s", name, backendNames())
}
