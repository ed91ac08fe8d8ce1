package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/reaper"
)

func newStopCmd() *cobra.Command {
	var dir, id string
	var grace time.Duration
	c := &cobra.Command{
		Use:   "stop --dir D [--grace 10s]",
		Short: "End every process of the launch and confirm none is left",
		Long: `Create D/stop (a launch that has not started never starts), send SIGINT to every
process of the launch and SIGCONT so it lands on stopped ones, SIGKILL after
--grace, then SIGKILL again to anything still found, until none is left. Works
when the supervisor is gone: processes are then found by their tag, by what
earlier passes recorded, and as descendants of those.
Exit 0 none left, 4 survivors listed.`,
		Args: noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if grace < 0 {
				return usagef("--grace %s is negative", grace)
			}
			return result(reaper.StopLaunch(dir, id, grace))
		},
	}
	addDirFlag(c, &dir)
	c.Flags().DurationVar(&grace, "grace", reaper.DefaultGrace, "time between SIGINT and SIGKILL")
	c.Flags().StringVar(&id, "id", "", "the launch id, for a launch run without a supervisor (no receipt): found by its tag")
	return c
}
