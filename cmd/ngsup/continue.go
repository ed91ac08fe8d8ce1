package main

import (
	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/reaper"
)

func newContinueCmd() *cobra.Command {
	var dir, id string
	c := &cobra.Command{
		Use:   "continue --dir D",
		Short: "Resume exactly what the last pause stopped",
		Long: `Thaw the launch's cgroup and send SIGCONT to exactly the processes the last
pause stopped (same pid AND start time), plus anything of the launch still
stopped, then remove D/pause. Exit 0, or 4 if something stays stopped.`,
		Args: noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			return result(reaper.ContinueLaunch(dir, id))
		},
	}
	addDirFlag(c, &dir)
	c.Flags().StringVar(&id, "id", "", "the launch id, for a launch run without a supervisor (no receipt): found by its tag")
	return c
}
