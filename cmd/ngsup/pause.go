package main

import (
	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/reaper"
)

func newPauseCmd() *cobra.Command {
	var dir string
	var opt reaper.PauseOptions
	c := &cobra.Command{
		Use:   "pause --dir D",
		Short: "Stop every process of the launch and confirm it",
		Long: `Create D/pause (so a launch that has not started waits), then stop every
process of the launch and confirm each is stopped (T), dead, or in an
uninterruptible call with SIGSTOP pending. Budgets: 5 s, and up to 30 s while the
only ones left are in an uninterruptible call.

Prints {"paused","processes","elapsed_ms","method","supervised","pending":[...]}.
Exit 0 paused; 3 the launch had already ended (its result is kept, nothing
paused); 4 not confirmed (pending lists pid, state and wchan; what was stopped
is continued again, and the caller falls back to stop).`,
		Args: noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			return result(reaper.Pause(dir, opt))
		},
	}
	addDirFlag(c, &dir)
	c.Flags().BoolVar(&opt.NoCgroup, "no-cgroup", false, "never freeze the launch's cgroup (signals only, even in a fork storm)")
	c.Flags().BoolVar(&opt.CgroupFirst, "cgroup-first", false, "freeze the launch's cgroup before the first pass (default: only when a fork storm shows)")
	c.Flags().StringVar(&opt.ID, "id", "", "the launch id, for a launch run without a supervisor (no receipt): found by its tag")
	c.Flags().DurationVar(&opt.StopBudget, "budget", reaper.StopBudget, "how long to wait for every process to stop")
	c.Flags().DurationVar(&opt.UninterruptibleBudget, "d-budget", reaper.UninterruptibleBudget, "how long to wait while only processes in uninterruptible calls are left")
	c.Flags().MarkHidden("budget")
	c.Flags().MarkHidden("d-budget")
	return c
}
