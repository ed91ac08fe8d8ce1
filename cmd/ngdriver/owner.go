package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/driver/config"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/httpowner"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/driver/serve"
	"github.com/ngharness/ngharness/pkg/gym"
)

// defaultOwnerListen is where owner serve listens when nothing says:
// loopback, so only this host reaches it.
const defaultOwnerListen = "127.0.0.1:8091"

func newOwnerCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "owner",
		Short: "The embedded local sandbox owner",
	}
	var listen, base, ngsupDir, isolation, tokenEnv, logFormat, backendName, cfgPath, instance string
	var removeUnused, keepSandboxes, keepFailed bool
	var leaseGrace time.Duration
	serveCmd := &cobra.Command{
		Use:   "serve --listen ADDR (--base DIR | --backend NAME --config FILE)",
		Short: "Serve the local owner over HTTP",
		Long: `Serve the embedded local owner over HTTP as a NeMo Gym resources server:
POST /seed_session, /sandbox_access, /verify and /close_session, also under
/ng-rollout/<capture key>/ (the prefix that binds a session to its attempt),
lending local sandboxes kept under --base. Point ngdriver serve's
backends.local.base at the same --base. Every call on a session needs the
session_id cookie its seed set (401 unauthorized otherwise, and nothing
changes); a seed for a key whose session exists needs it too, except for a
restored session no call has claimed yet, which a seed without it replaces
with a fresh one. GET /metrics (Prometheus) and GET /healthz need nothing.
--listen defaults to loopback. One owner holds a --base at a time
(<base>/owner.lock); before it listens it ends every process still running
in a sandbox of that base, which a deployment that died left there (found by
the mount namespace each runs in, so never another base's).

It is also a checkpoint participant of kind "resources", instance --instance:
Gym's control routes under /ng-control/v1/checkpoint (status, prepare, renew,
commit, restore, resume, retire, forget), with the bearer token read from the
variable --checkpoint-token-env names. While a checkpoint is open, session
calls wait for resume; prepare is ready once none is in flight. Commit
snapshots the sandbox of every open session in scope and writes one record per
session under <checkpoint_dir>/gym/resources/<instance>/; with stop, the
exported sandboxes are removed once the records are durable. Restore, in a
fresh owner process too, forks each snapshot into a new sandbox bound to the
next attempt's key; retire frees an attempt's sessions and later calls of it
answer 409 stale_attempt. Sessions with no sandbox, or whose run body asks to
restart, are reported as restarts and never exported. Without a token the
control routes answer 404 (not a participant). --lease-grace is Gym's
lease_grace_seconds.

A session's sandbox is removed when the session ends: at its verify
(whatever the reward), or at close_session, once every process of it has
been ended; a sandbox whose processes could not all be ended is kept, with a
warning. With --backend local a session closed without a verdict (its run
failed, was cancelled or gave up) keeps its sandbox for inspection
(--keep-failed-sandboxes=false removes those too). The sandbox a restore
replaces is removed the same way. --keep-sandboxes keeps every sandbox.
Snapshots are not sandboxes: one stays while a checkpoint folder this owner
committed to still holds the manifest naming it, and goes at the next commit
once none does. At start, the owner removes what a killed owner left half
done under --base (partial snapshot or fork copies, half-deleted folders).

With another --backend it lends sandboxes of that backend instead, made from
the image its section of the --config file's backends names:
` + lendsHelp(),
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("owner serve takes no arguments, got %q", args)
			}
			if backendName != local.Name {
				if cfgPath == "" {
					return usagef("--backend %s needs --config (its backends.%s section)", backendName, backendName)
				}
				return nil
			}
			if base == "" || !filepath.IsAbs(base) {
				return usagef("--base must be an absolute folder, got %q", base)
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			log := logger(logFormat, false).With("owner", "local")
			// The local backend's section is the flags: --base and
			// --isolation; every other backend's is the config's.
			section := map[string]any{"base": base, "isolation": isolation}
			if backendName != local.Name {
				cfg, err := config.Load(cfgPath, builtIn())
				if err != nil {
					return usageError{err.Error()}
				}
				section = cfg.Backends[backendName]
			}
			lender, release, err := buildLender(backendName, section, log)
			if err != nil {
				return err
			}
			if release != nil {
				defer release()
			}
			if !c.Flags().Changed("keep-failed-sandboxes") {
				keepFailed = backendName == local.Name
			}
			if c.Flags().Changed("remove-unused") && !removeUnused {
				keepSandboxes = true
			}
			binaries := launch.DefaultBinaries(ngsupDir)
			if len(binaries) == 0 {
				return fmt.Errorf("no ngsup binary found in %q (the owner stops sandboxes with it)", ngsupDir)
			}
			ng := &launch.Ngsup{Binaries: binaries, Log: log}
			own := lending.New(lending.Options{
				Sandboxes:    lender,
				RemoveUnused: !keepSandboxes,
				KeepFailed:   keepFailed,
				StopSandbox:  func(ctx context.Context, sb sandbox.Sandbox) error { return ng.StopSandbox(ctx, sb) },
				KillSandbox:  func(ctx context.Context, sb sandbox.Sandbox) error { return ng.StopSandboxGrace(ctx, sb, 0) },
				Logger:       log,
			})
			endUnowned(c.Context(), own, log)
			token := os.Getenv(tokenEnv)
			control, err := owner.NewControl(own, gym.Config{Instance: instance, LeaseGrace: leaseGrace,
				Logf: func(format string, args ...any) { log.Warn(fmt.Sprintf(format, args...)) }})
			if err != nil {
				return usagef("--instance %q / --lease-grace %s: %v", instance, leaseGrace, err)
			}
			if token == "" {
				log.Warn("no checkpoint token: the control routes answer 404 and this owner is not a checkpoint participant", "token_env", tokenEnv)
			} else {
				log.Info("checkpoint participant", "kind", own.Kind(), "instance", instance, "lease_grace", leaseGrace.String())
			}
			srv := &httpowner.Server{Owner: own, Control: control, Token: token, Log: log, Metrics: serve.NewRegistry(),
				ClientError: lending.ClientError}
			if listen == "" {
				listen = defaultOwnerListen // nothing configured: loopback only
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second}
			fmt.Fprintf(os.Stdout, "listening on http://%s\n", ln.Addr())
			log.Info("owner serving", "addr", ln.Addr().String(), "base", base)
			errc := make(chan error, 1)
			go func() { errc <- hs.Serve(ln) }()
			if t, ok := lender.(interface{ TTL() time.Duration }); ok && t.TTL() > 0 {
				// Sandboxes that expire: renew those of open sessions.
				kctx, stopRenew := context.WithCancel(context.Background())
				defer stopRenew()
				go own.KeepAlive(kctx, t.TTL()/3, t.TTL())
			}
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
			select {
			case err := <-errc:
				return err
			case <-sigs:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return hs.Shutdown(ctx)
		},
	}
	fl := serveCmd.Flags()
	fl.StringVar(&listen, "listen", defaultOwnerListen, "address to serve on (host:port; a host of 0.0.0.0 or none serves every interface)")
	fl.StringVar(&base, "base", "", "folder holding the sandboxes and snapshots (absolute; --backend local)")
	fl.StringVar(&backendName, "backend", local.Name, "the backend whose sandboxes are lent: "+backendNames())
	fl.StringVar(&cfgPath, "config", "", "the YAML config whose backends section configures --backend (not local)")
	fl.BoolVar(&keepSandboxes, "keep-sandboxes", false, "keep every session's sandbox after the session ends (default: removed at its verify or close, once its processes are ended)")
	fl.BoolVar(&keepFailed, "keep-failed-sandboxes", false, "keep the sandbox of a session closed without a verdict, for inspection (default true with --backend local, false otherwise)")
	fl.BoolVar(&removeUnused, "remove-unused", true, "remove a sandbox once no session uses it")
	_ = fl.MarkDeprecated("remove-unused", "sandboxes are removed by default; use --keep-sandboxes to keep them")
	fl.StringVar(&ngsupDir, "ngsup-dir", "", "folder of the ngsup binaries (default: beside ngdriver)")
	fl.StringVar(&isolation, "isolation", "auto", "auto, namespace or none")
	fl.StringVar(&tokenEnv, "checkpoint-token-env", "NG_CONTROL_TOKEN", "environment variable holding the checkpoint control routes' bearer token (unset or empty: no control routes)")
	fl.StringVar(&tokenEnv, "token-env", "NG_CONTROL_TOKEN", "the same as --checkpoint-token-env")
	fl.StringVar(&instance, "instance", "ngdriver_owner", "the checkpoint participant's instance name (records go under <checkpoint_dir>/gym/resources/<instance>)")
	fl.DurationVar(&leaseGrace, "lease-grace", 600*time.Second, "how long past a request's deadline an open checkpoint stays open without another call (Gym's lease_grace_seconds)")
	fl.StringVar(&logFormat, "log-format", "auto", "json, text or auto")
	c.AddCommand(serveCmd)
	return c
}

// sweep removes what a killed owner left half done under the local
// backend's base (local.Backend.Sweep) and says so in the log.
func sweep(log *slog.Logger, b *local.Backend) {
	removed, err := b.Sweep()
	if len(removed) > 0 {
		log.Info("removed what a killed process left half done", "base", b.Base(), "count", len(removed), "first", removed[:min(len(removed), 5)])
	}
	if err != nil {
		log.Warn("could not remove all a killed process left half done", "base", b.Base(), "err", err)
	}
}

// endUnowned ends, before an owner serves, what its base's sandboxes still
// run (lending.Owner.EndUnowned): a deployment on this base died and
// left it. It is bounded; what it could not end is a warning naming it
// (the owner serves all the same: a process stuck in the kernel must not
// keep a deployment from coming back).
func endUnowned(ctx context.Context, own *lending.Owner, log *slog.Logger) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	n, err := own.EndUnowned(ctx)
	if err != nil {
		log.Warn("could not end everything a deployment that died left in the sandboxes of this base", "ended", n, "err", err)
	} else if n > 0 {
		log.Info("ended what a deployment that died left running in the sandboxes of this base", "ended", n)
	}
}
