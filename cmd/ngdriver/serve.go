package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/claude"
	"github.com/ngharness/ngharness/pkg/codex"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/config"
	"github.com/ngharness/ngharness/pkg/driver/config/gymconfig"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner/httpowner"
	"github.com/ngharness/ngharness/pkg/driver/serve"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/opencode"
)

func newServeCmd() *cobra.Command {
	var cfgPath, gymPath, gymInstance string
	var over config.Config
	c := &cobra.Command{
		Use:   "serve --config FILE [--listen ADDR]",
		Short: "Serve rollouts and the checkpoint control plane over HTTP",
		Long: `Serve POST /run (one rollout per request, the result with ng_harness_launches),
the checkpoint control plane POST /ng-control/v1/checkpoint/{prepare,commit,
resume,restore,retire} (Authorization: Bearer <token>, checked before the
body is read), GET /metrics and GET /healthz (no token). It listens on
loopback (127.0.0.1:8090) unless the config or --listen names another
address. The config file is YAML (see examples/ngdriver.yaml); flags override
it. SIGTERM stops taking runs, lets running ones finish within
shutdown_timeout, and leaves the rest to the checkpoint.

As a NeMo Gym agent server: with --gym-config FILE, or when $NEMO_GYM_CONFIG_DICT
is set (as Gym's launcher sets it) and --config is not given, the settings come
from this server's entry of the Gym config ($NEMO_GYM_CONFIG_PATH or
--gym-instance names it; see examples/gym/).`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("serve takes no arguments, got %q", args)
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			cfg := config.Default()
			var gs *gymconfig.Settings
			switch {
			case cfgPath != "" && gymPath != "":
				return usagef("--config and --gym-config are two sources of the same settings: give one")
			case gymPath != "":
				var err error
				if gs, err = gymconfig.Load(gymPath, gymInstance, builtIn()); err != nil {
					return usageError{err.Error()}
				}
			case cfgPath != "":
				var err error
				if cfg, err = config.Load(cfgPath, builtIn()); err != nil {
					return usageError{err.Error()}
				}
			default:
				var err error
				if gs, _, err = gymconfig.FromEnv(gymInstance, builtIn()); err != nil {
					return usageError{err.Error()}
				}
			}
			if gs != nil {
				cfg = gs.Config
			} else if gymInstance != "" {
				return usagef("--gym-instance needs a Gym config (--gym-config or $%s)", gymconfig.EnvConfigDict)
			}
			fl := c.Flags()
			if fl.Changed("listen") {
				cfg.Listen = over.Listen
			}
			if fl.Changed("owner") {
				cfg.Owner.URL = over.Owner.URL
			}
			if fl.Changed("max-runs") {
				cfg.MaxRuns = over.MaxRuns
			}
			if fl.Changed("ngsup-dir") {
				cfg.NgsupDir = over.NgsupDir
			}
			if fl.Changed("name") {
				cfg.Name = over.Name
			}
			if fl.Changed("log-format") {
				cfg.LogFormat = over.LogFormat
			}
			if cfg.Listen == "" {
				cfg.Listen = config.Default().Listen // nothing configured: loopback only
			}
			if err := cfg.Validate(builtIn()); err != nil {
				return usageError{err.Error()}
			}
			return runServe(c.Context(), cfg, gs)
		},
	}
	fl := c.Flags()
	fl.StringVar(&cfgPath, "config", "", "the YAML config file")
	fl.StringVar(&gymPath, "gym-config", "", "a NeMo Gym config file holding this server's agent entry (instead of --config)")
	fl.StringVar(&gymInstance, "gym-instance", "", "this server's entry in the Gym config (default $NEMO_GYM_CONFIG_PATH)")
	fl.StringVar(&over.Listen, "listen", "", "address to serve on (overrides listen; default 127.0.0.1:8090)")
	fl.StringVar(&over.Owner.URL, "owner", "", "the sandbox owner's URL (overrides owner.url)")
	fl.IntVar(&over.MaxRuns, "max-runs", 0, "runs in flight at most (overrides max_runs)")
	fl.StringVar(&over.NgsupDir, "ngsup-dir", "", "folder of the ngsup binaries (overrides ngsup_dir)")
	fl.StringVar(&over.Name, "name", "", "participant name in checkpoint records (overrides name)")
	fl.StringVar(&over.LogFormat, "log-format", "", "json, text or auto (overrides log_format)")
	return c
}

// logGymSettings says where a Gym config put this server.
func logGymSettings(log *slog.Logger, gs *gymconfig.Settings) {
	args := []any{"instance", gs.Instance, "agent_type", gs.AgentType, "listen", gs.Config.Listen,
		"resources_server", gs.ResourcesServer.Name, "owner", gs.ResourcesServer.URL,
		"checkpoint_enabled", gs.Checkpoint.Enabled, "lease_grace", gs.Checkpoint.LeaseGrace.String()}
	if gs.ModelServer != nil {
		args = append(args, "model_server", gs.ModelServer.Name, "model_url", gs.ModelServer.URL)
	}
	log.Info("configured from the Gym config", args...)
	if len(gs.Ignored) > 0 {
		log.Debug("Gym config keys ngdriver does not use", "keys", gs.Ignored)
	}
}

// logger writes JSON lines unless stderr is a terminal (or format says);
// debug adds debug records.
func logger(format string, debug bool) *slog.Logger {
	if format == "auto" {
		format = "json"
		if _, err := unix.IoctlGetTermios(int(os.Stderr.Fd()), unix.TCGETS); err == nil {
			format = "text"
		}
	}
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	if format == "text" {
		return newLogger(level)
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// buildRunner makes the driver's runner from the config.
func buildRunner(cfg config.Config, log *slog.Logger) (*driver.Runner, error) {
	if cfg.Owner.URL == "" {
		return nil, usagef("no owner: set owner.url in the config or --owner")
	}
	backends, err := buildBackends(cfg.Backends)
	if err != nil {
		return nil, err
	}
	binaries := launch.DefaultBinaries(cfg.NgsupDir)
	if len(binaries) == 0 {
		return nil, fmt.Errorf("no ngsup binary found in %q (build with `make build`, or set ngsup_dir)", cfg.NgsupDir)
	}
	adapter, err := buildAdapter(cfg)
	if err != nil {
		return nil, err
	}
	participant, err := driver.NewParticipant(driver.ParticipantConfig{
		MaxRuns: cfg.MaxRuns, Adapter: adapter.Name(), Instance: cfg.Name, LeaseGrace: cfg.LeaseGrace.D(),
		Logf: func(format string, args ...any) { log.Info(fmt.Sprintf(format, args...)) },
	})
	if err != nil {
		return nil, usageError{err.Error()}
	}
	return &driver.Runner{
		Adapter: adapter,
		Owner: &httpowner.Client{BaseURL: cfg.Owner.URL, Timeout: cfg.Owner.Timeout.D(),
			VerifyTimeout: cfg.Owner.VerifyTimeout.D(), Retries: cfg.Owner.Retries},
		Backends:           backends,
		Launchers:          &launch.Ngsup{Binaries: binaries, Log: log},
		Participant:        participant,
		Log:                log,
		PauseAtCheckpoints: cfg.PauseAtCheckpoints,
		StopGrace:          cfg.StopGrace.D(),
	}, nil
}

// adapterEntry is one harness adapter built into ngdriver: what the config
// knows of its section, and how to build it.
type adapterEntry struct {
	// keys are the common keys its section takes (the harness binary's,
	// model_url and model): `ngdriver run` and a Gym config fill them.
	keys config.AdapterKeys
	// build makes the adapter from its section of the config (nil when
	// the config has none) and the rest of the config.
	build func(section map[string]any, cfg config.Config) (harness.Adapter, error)
}

// adapters is the one table of harness adapters, by the name the config's
// `adapter` (and `ngdriver run --adapter`) gives and its section's key:
// adding one touches only here.
var adapters = map[string]adapterEntry{
	"fake": {build: func(section map[string]any, cfg config.Config) (harness.Adapter, error) {
		a := &fake.Adapter{Pause: true}
		if err := remarshal(section, &a.Defaults); err != nil {
			return nil, usagef("fake: %v", err)
		}
		return a, nil
	}},
	"opencode": {keys: config.AdapterKeys{Binary: "opencode", Model: true},
		build: func(section map[string]any, cfg config.Config) (harness.Adapter, error) {
			var opt opencode.Options
			if err := remarshal(section, &opt); err != nil {
				return nil, usagef("opencode: %v", err)
			}
			opt.ResumeBinaries = launch.FindBinaries(cfg.NgsupDir, "ngresume")
			if len(opt.ResumeBinaries) == 0 {
				return nil, fmt.Errorf("no ngresume binary found in %q (build with `make build`, or set ngsup_dir)", cfg.NgsupDir)
			}
			return built(opencode.New(opt))
		}},
	"codex":  {keys: config.AdapterKeys{Binary: "codex", Model: true}, build: fromSection("codex", codex.New)},
	"claude": {keys: config.AdapterKeys{Binary: "claude", Model: true}, build: fromSection("claude", claude.New)},
}

// fromSection is the build of an adapter whose options are its section:
// the section is read into O strictly (an unknown key is an error naming
// it), then newAdapter makes the adapter.
func fromSection[O any, A harness.Adapter](name string, newAdapter func(O) (A, error)) func(map[string]any, config.Config) (harness.Adapter, error) {
	return func(section map[string]any, _ config.Config) (harness.Adapter, error) {
		var opt O
		if err := remarshal(section, &opt); err != nil {
			return nil, usagef("%s: %v", name, err)
		}
		return built(newAdapter(opt))
	}
}

// built is what an adapter's New returned, its error (bad options) a
// usage error.
func built[A harness.Adapter](a A, err error) (harness.Adapter, error) {
	if err != nil {
		return nil, usageError{err.Error()}
	}
	return a, nil
}

// builtIn is what the config knows of the adapters in the table.
func builtIn() config.Adapters {
	k := config.Adapters{}
	for name, a := range adapters {
		k[name] = a.keys
	}
	return k
}

func buildAdapter(cfg config.Config) (harness.Adapter, error) {
	a, ok := adapters[cfg.Adapter]
	if !ok {
		return nil, usagef("adapter %q is not built into this ngdriver (it has %s)", cfg.Adapter, builtIn().Names())
	}
	return a.build(cfg.Sections[cfg.Adapter], cfg)
}

func runServe(ctx context.Context, cfg config.Config, gs *gymconfig.Settings) error {
	log := logger(cfg.LogFormat, gs != nil && gs.Verbose).With("participant", cfg.Name)
	if gs != nil {
		logGymSettings(log, gs)
	}
	rn, err := buildRunner(cfg, log)
	if err != nil {
		return err
	}
	token := cfg.ControlToken()
	switch {
	case token == "" && gs != nil:
		log.Warn("checkpointing is off in the Gym config: the checkpoint routes answer 404, so Gym's coordinator leaves this server out (set checkpoint.enabled and checkpoint.control_auth_token)")
	case token == "":
		log.Warn("no control token configured: the checkpoint routes answer 404 and this server takes part in no checkpoint (set token or token_env)")
	}
	metrics := serve.NewMetrics(rn.Participant)
	rn.Observer = metrics
	srv := &serve.Server{Runner: rn, Token: token, Metrics: metrics, Log: log}
	handler, err := srv.Handler()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second}
	log.Info("serving", "addr", ln.Addr().String(), "adapter", cfg.Adapter, "max_runs", cfg.MaxRuns)
	fmt.Fprintf(os.Stdout, "listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sigs)
	select {
	case err := <-errc:
		return err
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String(), "timeout", cfg.ShutdownTimeout.D().String())
	case <-ctx.Done():
	}
	return shutdown(rn.Participant, srv, hs, cfg.ShutdownTimeout.D(), log)
}

// shutdown stops taking runs, lets running ones finish for half the bound,
// parks what is still running (harnesses paused in place, as at a
// checkpoint) for the rest of it, then leaves the parked runs to the
// checkpoint and closes the server.
func shutdown(p *driver.Participant, srv *serve.Server, hs *http.Server, bound time.Duration, log *slog.Logger) error {
	p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), bound/2)
	defer cancel()
	err := p.WaitFor(ctx, func(runs []driver.RunInfo) bool { return len(runs) == 0 })
	if err != nil {
		n := len(p.Runs())
		log.Warn("runs still in flight at half the shutdown bound; parking them", "runs", n)
		if perr := p.Park(context.Background(), time.Now().Add(bound/2)); perr != nil {
			log.Warn("runs not parked by the shutdown bound; leaving them as they are", "error", perr.Error())
		} else {
			log.Info("runs parked for the shutdown; a restore of the last checkpoint continues them", "runs", n)
		}
		srv.ParkAll()
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
