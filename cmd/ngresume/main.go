// Command ngresume continues a saved OpenCode session inside a sandbox
// without adding a user turn (see pkg/opencode/resume). The OpenCode adapter
// uploads it only when a relaunch needs it, and runs it under ngsup as the
// harness of the relaunch. It prints one JSON line; exit 0 continued, 3 no
// session to continue, 4 the user turns changed, 1 anything else, 2 usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/pkg/opencode/resume"
)

func main() {
	var opt resume.Options
	fs := flag.NewFlagSet("ngresume", flag.ContinueOnError)
	fs.StringVar(&opt.OpenCode, "opencode", "opencode", "the opencode binary")
	fs.StringVar(&opt.SessionID, "session", "", "the session to continue (default: the latest top-level one)")
	fs.StringVar(&opt.Directory, "directory", "", "the session's working folder (default: the one it recorded)")
	fs.DurationVar(&opt.ReadyTimeout, "ready-timeout", 90*time.Second, "how long opencode serve may take to start")
	fs.DurationVar(&opt.TurnTimeout, "turn-timeout", 0, "bound on the continued turn loop (0: none)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ngresume [--opencode PATH] [--session ID] [--directory DIR]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "ngresume: unexpected arguments %q\n", fs.Args())
		os.Exit(2)
	}
	opt.Log = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := resume.Run(ctx, opt)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ngresume: %v\n", err)
		switch {
		case errors.Is(err, resume.ErrNoSession):
			os.Exit(3)
		case errors.Is(err, resume.ErrUserTurnsChanged):
			os.Exit(4)
		}
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(res)
}
