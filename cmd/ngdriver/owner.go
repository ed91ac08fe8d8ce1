package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/config"
	"github.com/ngharness/ngharness/pkg/driver/owner/httpowner"
	"github.com/ngharness/ngharness/pkg/driver/owner/localowner"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

func newOwnerCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "owner",
		Short: "The embedded local sandbox owner",
	}
	var listen, base, ngsupDir, isolation, tokenEnv, logFormat, backendName, cfgPath string
	var removeUnused bool
	serveCmd := &cobra.Command{
		Use:   "serve --listen ADDR (--base DIR | --backend NAME --config FILE)",
		Short: "Serve the local owner over HTTP",
		Long: `Serve the embedded local owner over HTTP: POST /seed_session, /sandbox_access,
/verify and /close_session as a resources server answers them, lending local
sandboxes kept under --base. Its checkpoint side answers the control plane:
commit snapshots every open session's sandbox, restore forks each snapshot
under a new sandbox id, retire drops a checkpoint's snapshots. Point
ngdriver serve's backends.local.base at the same --base.

With --backend opensandbox, docker or kubectl it lends sandboxes of that
backend instead, made from the image that section of the --config file's
backends names (OpenSandbox: create and snapshot through the lifecycle
server, renewing the expiration of open sessions' sandboxes; docker: run,
commit, rm; kubectl: run, tar snapshots kept in snapshot_dir, delete).
Sandboxes no session uses any more are then removed unless
--remove-unused=false.`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("owner serve takes no arguments, got %q", args)
			}
			if backendName != "local" {
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
			var lender localowner.Sandboxes
			if backendName == "local" {
				backend, err := local.New(base, local.Options{Isolation: isolation})
				if err != nil {
					return err
				}
				lender = localowner.Local(backend)
			} else {
				cfg, err := config.Load(cfgPath)
				if err != nil {
					return usageError{err.Error()}
				}
				if lender, err = buildLender(cfg.Backends, backendName); err != nil {
					return err
				}
				if !c.Flags().Changed("remove-unused") {
					removeUnused = true
				}
			}
			binaries := driver.DefaultBinaries(ngsupDir)
			if len(binaries) == 0 {
				return fmt.Errorf("no ngsup binary found in %q (the owner stops sandboxes with it)", ngsupDir)
			}
			ng := &driver.Ngsup{Binaries: binaries, Log: log}
			own := localowner.New(localowner.Options{
				Sandboxes:    lender,
				RemoveUnused: removeUnused,
				StopSandbox:  func(ctx context.Context, sb sandbox.Sandbox) error { return ng.StopSandbox(ctx, sb) },
				KillSandbox:  func(ctx context.Context, sb sandbox.Sandbox) error { return ng.StopSandboxGrace(ctx, sb, 0) },
				Logger:       log,
			})
			srv := &httpowner.Server{Owner: own, Checkpoints: own, Token: os.Getenv(tokenEnv), Log: log,
				ClientError: func(err error) bool {
					var se *json.SyntaxError
					return errors.Is(err, localowner.ErrUnknownSession) || errors.Is(err, localowner.ErrUnknownCheckpoint) ||
						errors.As(err, &se) || strings.Contains(err.Error(), "run body")
				}}
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
	fl.StringVar(&listen, "listen", "127.0.0.1:8091", "address to serve on")
	fl.StringVar(&base, "base", "", "folder holding the sandboxes and snapshots (absolute; --backend local)")
	fl.StringVar(&backendName, "backend", "local", "the backend whose sandboxes are lent: local, opensandbox, docker or kubectl")
	fl.StringVar(&cfgPath, "config", "", "the YAML config whose backends section configures --backend (not local)")
	fl.BoolVar(&removeUnused, "remove-unused", false, "remove a sandbox once no session uses it (default true for every backend but local)")
	fl.StringVar(&ngsupDir, "ngsup-dir", "", "folder of the ngsup binaries (default: beside ngdriver)")
	fl.StringVar(&isolation, "isolation", "auto", "auto, namespace or none")
	fl.StringVar(&tokenEnv, "token-env", "NG_CONTROL_TOKEN", "environment variable holding the control-plane token")
	fl.StringVar(&logFormat, "log-format", "auto", "json, text or auto")
	c.AddCommand(serveCmd)
	return c
}

// remarshal copies a decoded YAML map into a typed struct, rejecting
// unknown fields.
func remarshal(in map[string]any, out any) error {
	if len(in) == 0 {
		return nil
	}
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	return dec.Decode(out)
}
