package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/pkg/reaper"
)

// superviseFlag marks the detached supervisor that `run --detach` starts.
const superviseFlag = "supervise-detached"

func newRunCmd() *cobra.Command {
	var opt reaper.RunOptions
	var detach, supervise bool
	c := &cobra.Command{
		Use:   "run --dir D --id ID [--detach] [--timeout DUR] [--stdin FILE] -- CMD ARGS...",
		Short: "Launch CMD as the harness, supervised",
		Long: `Launch CMD as the harness: its own session and process group (so that the
supervisor's death, even while the launch is paused, neither wakes nor hangs
up the harness's group), ngsup as the child subreaper of everything it starts,
and NEMO_GYM_HARNESS_LAUNCH=ID in its environment.
Refuses to start if D/stop exists; waits while D/pause exists. When the harness
exits, what it left in its process group is killed and reaped, and the receipt
records the end.

Foreground: exits with the harness's code (128+N for signal N, 127 not found,
126 not runnable). --detach: the supervisor leaves the caller's session, the
command prints {"id","pid","start_ticks"} and exits 0; the harness's output goes
to D/stdout and D/stderr. --stdin FILE: the harness reads FILE as its stdin
(otherwise /dev/null when detached, ngsup's own stdin in the foreground).`,
		Args: func(c *cobra.Command, args []string) error {
			if c.ArgsLenAtDash() != 0 || len(args) == 0 {
				return usagef("run needs the harness command after --")
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			opt.Command = args
			if err := checkRun(&opt); err != nil {
				return err
			}
			switch {
			case supervise:
				return runDetachedSupervisor(opt)
			case detach:
				return result(detachRun(opt))
			}
			opt.Log = logStderr
			code, err := reaper.Supervise(opt)
			if err != nil {
				return &exitError{code: exitCodeFor(err), err: err}
			}
			if code < 0 {
				r, _ := proto.ReadReceipt(opt.Dir)
				why := "the launch ended without an exit code"
				if r != nil && r.Error != "" {
					why = r.Error
				}
				return &exitError{code: proto.ExitInternal, err: errors.New(why)}
			}
			if code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
	addDirFlag(c, &opt.Dir)
	c.Flags().StringVar(&opt.ID, "id", "", "the launch id (letters, digits and . _ - : @ + =)")
	c.Flags().BoolVar(&detach, "detach", false, "leave the caller's session at once and print the supervisor's identity")
	c.Flags().DurationVar(&opt.Timeout, "timeout", 0, "end the harness after this much running time (paused time not counted)")
	c.Flags().DurationVar(&opt.Grace, "grace", reaper.DefaultGrace, "after --timeout's SIGINT, wait this long before SIGKILL")
	c.Flags().BoolVar(&opt.NoCgroup, "no-cgroup", false, "do not put the launch in a cgroup of its own (signals only)")
	c.Flags().StringVar(&opt.Stdin, "stdin", "", "the file the harness reads as its stdin (absolute)")
	c.Flags().BoolVar(&supervise, superviseFlag, false, "internal: run as the detached supervisor")
	c.Flags().MarkHidden(superviseFlag)
	return c
}

// checkRun checks run's --dir (cleaned in place), --id and --stdin before
// anything starts.
func checkRun(opt *reaper.RunOptions) error {
	dir, err := proto.ValidateDir(opt.Dir)
	if err != nil {
		return err
	}
	opt.Dir = dir
	if err := proto.ValidateID(opt.ID); err != nil {
		return err
	}
	if opt.Stdin != "" {
		if !filepath.IsAbs(opt.Stdin) {
			return usagef("--stdin %q is not an absolute path", opt.Stdin)
		}
		f, err := os.Open(opt.Stdin)
		if err != nil {
			return usagef("--stdin: %v", err)
		}
		f.Close()
	}
	return nil
}

func logStderr(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// detachRun starts ngsup again as the detached supervisor, in a session of
// its own, and waits until it has written its first receipt.
func detachRun(opt reaper.RunOptions) (proto.DetachResult, int, error) {
	var res proto.DetachResult
	if err := os.MkdirAll(opt.Dir, 0o755); err != nil {
		return res, proto.ExitUsage, fmt.Errorf("%w: create %s: %v", proto.ErrBadDir, opt.Dir, err)
	}
	self, err := os.Executable()
	if err != nil {
		return res, proto.ExitInternal, fmt.Errorf("find ngsup's own binary: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(opt.Dir, proto.SupervisorLogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return res, proto.ExitUsage, fmt.Errorf("%w: %v", proto.ErrBadDir, err)
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return res, proto.ExitInternal, err
	}
	defer devnull.Close()
	rd, wr, err := os.Pipe()
	if err != nil {
		return res, proto.ExitInternal, err
	}
	defer rd.Close()
	args := []string{"ngsup", "run", "--" + superviseFlag, "--dir", opt.Dir, "--id", opt.ID,
		"--timeout", opt.Timeout.String(), "--grace", opt.Grace.String()}
	if opt.NoCgroup {
		args = append(args, "--no-cgroup")
	}
	if opt.Stdin != "" {
		args = append(args, "--stdin", opt.Stdin)
	}
	args = append(append(args, "--"), opt.Command...)
	proc, err := os.StartProcess(self, args, &os.ProcAttr{
		Files: []*os.File{devnull, logf, logf, wr},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	wr.Close()
	if err != nil {
		return res, proto.ExitInternal, fmt.Errorf("start the detached supervisor: %w", err)
	}
	pid := proc.Pid
	proc.Release()
	rd.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, rerr := bufio.NewReader(rd).ReadString('\n')
	line = strings.TrimSpace(line)
	if line != "ok" {
		if line == "" {
			line = fmt.Sprintf("the detached supervisor (pid %d) said nothing (%v); see %s", pid, rerr, filepath.Join(opt.Dir, proto.SupervisorLogFile))
		}
		return res, proto.ExitUsage, errors.New(line)
	}
	id, err := reaper.ProcFS.Identify(pid)
	if err != nil {
		// It ended already (a harness that could not start, say); the
		// receipt holds its identity and its end.
		r, rerr := proto.ReadReceipt(opt.Dir)
		if rerr != nil {
			return res, proto.ExitInternal, rerr
		}
		id = proto.Proc{PID: r.SupervisorPID, StartTicks: r.SupervisorStartTicks}
	}
	return proto.DetachResult{ID: opt.ID, PID: id.PID, StartTicks: id.StartTicks}, proto.ExitOK, nil
}

// runDetachedSupervisor is the supervisor started by detachRun. Its stdout
// and stderr are the launch's supervisor.log; fd 3 is the ready pipe.
func runDetachedSupervisor(opt reaper.RunOptions) error {
	opt.Detached = true
	opt.Ready = os.NewFile(3, "ready")
	opt.Log = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, time.Now().UTC().Format(time.RFC3339Nano)+" "+format+"\n", args...)
	}
	code, err := reaper.Supervise(opt)
	if err != nil {
		return &exitError{code: exitCodeFor(err), err: err}
	}
	if code != 0 {
		return &exitError{code: max(code, 1)}
	}
	return nil
}
