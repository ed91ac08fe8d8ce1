package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/ngharness/ngharness/pkg/driver/config"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/docker"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/kubectl"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// backends is the one table of the sandbox backends built into ngdriver,
// in the order help text lists them: adding one is a row here (and json
// tags on its Options). The config's backends section is checked against
// it (backendKinds), `ngdriver serve` builds every backend the config has
// a section for (buildBackends), and `ngdriver owner serve --backend NAME`
// lends sandboxes of one (buildLender).
var backends = []backendRow{
	localBackend(),
	remoteOf(opensandbox.Name, newOpenSandbox, nil, "create, snapshot, renew and delete through the lifecycle server"),
	remoteOf(docker.Name, docker.New, nil, "docker run, commit, rm"),
	remoteOf(kubectl.Name, kubectl.New, func(o kubectl.Options) error {
		if o.SnapshotDir == "" {
			return usagef("backends.kubectl.snapshot_dir is required to lend pods (snapshots are tar files kept there)")
		}
		return nil
	}, "kubectl run, tar snapshots kept in snapshot_dir, delete"),
}

// backendRow is one sandbox backend: its name and what ngdriver does with
// its section.
type backendRow struct {
	// name is its provider name: its section's key under backends, and
	// the provider of the sandboxes an owner's descriptors name.
	name string
	// kind is what the config knows of its section.
	kind config.BackendKind
	// build makes the backend from its section, for `ngdriver serve`.
	build func(section map[string]any) (sandbox.Backend, error)
	// lend makes what `ngdriver owner serve --backend NAME` lends from
	// its section, and what to call once the owner is done (nil: nothing).
	lend func(section map[string]any, log *slog.Logger) (sandbox.Lender, func(), error)
	// lends says, in owner serve's help, how an owner lends its sandboxes
	// ("": the help's own text says it).
	lends string
}

// reader reads backend name's section into O, its options, with the one
// section reader (config.DecodeSection) and kind's checks; an error is a
// usage error naming the key.
func reader[O any](name string, kind config.BackendKind) func(map[string]any) (O, error) {
	return func(section map[string]any) (O, error) {
		o, err := kind.Read(name, section)
		if err != nil {
			var zero O
			return zero, usageError{err.Error()}
		}
		return *o.(*O), nil
	}
}

// remoteOf is the row of a backend reached through a remote provider,
// whose section is read into O (its Options, or a struct embedding them)
// and made into the backend by build. It lends sandboxes it creates from
// its section's image; lend, when not nil, checks what else lending
// needs, and lends says how it lends them (for help).
func remoteOf[O any, B remoteBackend](name string, build func(O) (B, error), lend func(O) error, lends string) backendRow {
	kind := config.KindOf[O](nil)
	read := reader[O](name, kind)
	return backendRow{
		name:  name,
		kind:  kind,
		lends: lends,
		build: func(section map[string]any) (sandbox.Backend, error) {
			o, err := read(section)
			if err != nil {
				return nil, err
			}
			return build(o)
		},
		lend: func(section map[string]any, _ *slog.Logger) (sandbox.Lender, func(), error) {
			o, err := read(section)
			if err != nil {
				return nil, nil, err
			}
			if img, _ := section["image"].(string); strings.TrimSpace(img) == "" {
				return nil, nil, usagef("backends.%s.image is required to lend sandboxes", name)
			}
			if lend != nil {
				if err := lend(o); err != nil {
					return nil, nil, err
				}
			}
			be, err := build(o)
			if err != nil {
				return nil, nil, err
			}
			return be, nil, nil
		},
	}
}

// remoteBackend is a backend that both runs the driver's commands and
// lends sandboxes to an owner.
type remoteBackend interface {
	sandbox.Backend
	sandbox.Lender
}

// localSection is backends.local: the base folder and the backend's
// Options.
type localSection struct {
	// Base is the folder holding the sandboxes and snapshots: the same
	// one `ngdriver owner serve --base` lends them from.
	Base string `json:"base"`
	local.Options
}

// localBackend is the row of the local backend: folders under a base on
// this machine. An owner lends them from its --base and --isolation
// (ownerLocalSection), claiming the base (one owner per base) and
// sweeping what a killed owner left half done.
func localBackend() backendRow {
	kind := config.KindOf(func(s *localSection) error {
		switch s.Isolation {
		case "", local.IsolationAuto, local.IsolationNamespace, local.IsolationNone:
			return nil
		}
		return fmt.Errorf("isolation %q: want auto, namespace or none", s.Isolation)
	})
	read := reader[localSection](local.Name, kind)
	return backendRow{
		name: local.Name,
		kind: kind,
		build: func(section map[string]any) (sandbox.Backend, error) {
			s, err := read(section)
			if err != nil {
				return nil, err
			}
			if s.Base == "" {
				return nil, usagef("backends.local.base is required")
			}
			return local.New(s.Base, s.Options)
		},
		lend: func(section map[string]any, log *slog.Logger) (sandbox.Lender, func(), error) {
			s, err := read(section)
			if err != nil {
				return nil, nil, err
			}
			backend, err := local.New(s.Base, s.Options)
			if err != nil {
				return nil, nil, err
			}
			release, err := backend.Claim()
			if err != nil {
				return nil, nil, err
			}
			sweep(log, backend)
			return backend.Lender(), release, nil
		},
	}
}

// openSandboxSection is backends.opensandbox: the backend's Options and
// the environment variable holding the key when api_key is not given.
type openSandboxSection struct {
	opensandbox.Options
	// APIKeyEnv names the variable holding the key (default
	// OPEN_SANDBOX_API_KEY).
	APIKeyEnv string `json:"api_key_env"`
}

func newOpenSandbox(s openSandboxSection) (*opensandbox.Backend, error) {
	if s.Server == "" {
		return nil, usagef("backends.opensandbox.server is required (the lifecycle server, e.g. http://opensandbox:8080)")
	}
	if s.APIKey == "" {
		env := s.APIKeyEnv
		if env == "" {
			env = "OPEN_SANDBOX_API_KEY"
		}
		s.APIKey = os.Getenv(env)
	}
	return opensandbox.New(s.Options)
}

// backendKinds is what the config knows of the backends in the table.
func backendKinds() config.BackendKinds {
	k := config.BackendKinds{}
	for _, b := range backends {
		k[b.name] = b.kind
	}
	return k
}

// backendNames lists the backends of the table in its order, the last
// after "or", for help text and errors.
func backendNames() string {
	names := make([]string, len(backends))
	for i, b := range backends {
		names[i] = b.name
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// lendsHelp is a line per backend of the table that says how an owner
// lends its sandboxes, for owner serve's help.
func lendsHelp() string {
	var b strings.Builder
	for _, row := range backends {
		if row.lends != "" {
			fmt.Fprintf(&b, "  %-12s %s\n", row.name, row.lends)
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// backendRowOf is the table's row of backend name.
func backendRowOf(name string) (backendRow, bool) {
	for _, b := range backends {
		if b.name == name {
			return b, true
		}
	}
	return backendRow{}, false
}

// buildBackends makes every backend the config's backends section has a
// section for, by provider name.
func buildBackends(b config.Backends) (map[string]sandbox.Backend, error) {
	out := map[string]sandbox.Backend{}
	for _, row := range backends {
		section := b[row.name]
		if section == nil {
			continue
		}
		be, err := row.build(section)
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

// buildLender makes what an owner lends sandboxes of: backend name, from
// its section (nil: the config has none), and what to call once the owner
// is done (nil: nothing).
func buildLender(name string, section map[string]any, log *slog.Logger) (sandbox.Lender, func(), error) {
	row, ok := backendRowOf(name)
	if !ok {
		return nil, nil, usagef("--backend %q: want one of %s", name, backendNames())
	}
	if section == nil {
		return nil, nil, usagef("--backend %s: the config has no backends.%s section", name, name)
	}
	return row.lend(section, log)
}
