package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ngharness/ngharness/pkg/claude"
	"github.com/ngharness/ngharness/pkg/codex"
	"github.com/ngharness/ngharness/pkg/driver/config"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/opencode"
	"github.com/ngharness/ngharness/pkg/pi"
)

// adapters is the one table of the harness adapters built into ngdriver,
// by name: the value of the config's `adapter` (and of `ngdriver run
// --adapter`) and its section's key at the top of the config. A row holds
// everything adapter-specific the CLI and the config readers know: adding
// an adapter is a row here.
var adapters = map[string]adapterRow{
	"fake": {options: func() any { return &fake.Options{} }, build: func(section map[string]any, _ config.Config) (harness.Adapter, error) {
		a := &fake.Adapter{Pause: true}
		if err := config.DecodeSection(section, &a.Defaults, "fake"); err != nil {
			return nil, usageError{err.Error()}
		}
		return a, nil
	}},
	"opencode": {
		keys: config.AdapterKeys{Binary: "opencode", Model: true, Gym: []config.GymKey{
			// Gym's OpenCode agent's keys that have an equivalent.
			{Gym: "remote_opencode_binary_path", Ours: "opencode", As: config.GymString},
			{Gym: "opencode_max_context_window", Ours: "context_window", As: config.GymCount},
			{Gym: "sandbox_timeout", Ours: "timeout", As: config.GymSeconds},
			{Gym: "opencode_config.permission", Ours: "permission", As: config.GymAny},
		}},
		options: func() any { return &opencode.Options{} },
		build: func(section map[string]any, cfg config.Config) (harness.Adapter, error) {
			var opt opencode.Options
			if err := config.DecodeSection(section, &opt, "opencode"); err != nil {
				return nil, usageError{err.Error()}
			}
			opt.ResumeBinaries = launch.FindBinaries(cfg.NgsupDir, "ngresume")
			if len(opt.ResumeBinaries) == 0 {
				return nil, fmt.Errorf("no ngresume binary found in %q (build with `make build`, or set ngsup_dir)", cfg.NgsupDir)
			}
			return built(opencode.New(opt))
		},
	},
	"codex":  fromSection("codex", config.AdapterKeys{Binary: "codex", Model: true}, codex.New),
	"claude": fromSection("claude", config.AdapterKeys{Binary: "claude", Model: true}, claude.New),
	"pi":     fromSection("pi", config.AdapterKeys{Binary: "pi", Model: true}, pi.New),
}

// adapterRow is one harness adapter built into ngdriver.
type adapterRow struct {
	// keys is what the config readers know of its section: the keys
	// common to adapters it takes (the harness binary's, model_url and
	// model), which `ngdriver run`'s flags and a Gym config's
	// model_server fill, and the keys of Gym's own agent for the harness
	// that a Gym config maps onto it.
	keys config.AdapterKeys
	// options is a new, zero value of the options its build reads the
	// section into (a pointer), so what reads sections as the adapter does
	// (the examples' test) needs no list of its own.
	options func() any
	// build makes the adapter from its section of the config (nil when
	// the config has none) and the rest of the config.
	build func(section map[string]any, cfg config.Config) (harness.Adapter, error)
}

// fromSection is the row of an adapter whose options are its section, with
// the keys keys: the section is read into O by the one section reader
// (config.DecodeSection: an unknown key is an error naming it), then
// newAdapter makes the adapter.
func fromSection[O any, A harness.Adapter](name string, keys config.AdapterKeys, newAdapter func(O) (A, error)) adapterRow {
	return adapterRow{keys: keys, options: func() any { return new(O) }, build: func(section map[string]any, _ config.Config) (harness.Adapter, error) {
		var opt O
		if err := config.DecodeSection(section, &opt, name); err != nil {
			return nil, usageError{err.Error()}
		}
		return built(newAdapter(opt))
	}}
}

// built is what an adapter's New returned, its error (bad options) a
// usage error.
func built[A harness.Adapter](a A, err error) (harness.Adapter, error) {
	if err != nil {
		return nil, usageError{err.Error()}
	}
	return a, nil
}

// builtIn is what the config knows of the adapters and backends in the
// tables.
func builtIn() config.Known {
	k := config.Known{Adapters: config.Adapters{}, Backends: backendKinds()}
	for name, a := range adapters {
		k.Adapters[name] = a.keys
	}
	return k
}

// buildAdapter makes the adapter the config selects from its section.
func buildAdapter(cfg config.Config) (harness.Adapter, error) {
	a, ok := adapters[cfg.Adapter]
	if !ok {
		return nil, usagef("adapter %q is not built into this ngdriver (it has %s)", cfg.Adapter, builtIn().Adapters.Names())
	}
	return a.build(cfg.Sections[cfg.Adapter], cfg)
}

// binaryKeys lists each adapter's binary key, for --harness-bin's help.
func binaryKeys() string {
	var keys []string
	for name, a := range adapters {
		if a.keys.Binary != "" {
			keys = append(keys, name+"."+a.keys.Binary)
		}
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}
