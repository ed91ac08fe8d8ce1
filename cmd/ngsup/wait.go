package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/reaper"
)

func newWaitCmd() *cobra.Command {
	var dir string
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "wait --dir D [--timeout DUR]",
		Short: "Block until the launch has ended or the timeout, and print the receipt",
		Long: `Block until the launch has ended, or until --timeout passes, then print the
receipt as one line of JSON. Exit 0 when the launch has ended, 3 when it is
still running. A launch whose supervisor died without recording the end, with
its harness gone too, is reported ended with exit_code -1 and an error. The
cgroup of an ended launch is removed when nothing is left in it.`,
		Args: noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if timeout < 0 {
				return usagef("--timeout %s is negative", timeout)
			}
			return result(reaper.Wait(dir, timeout))
		},
	}
	addDirFlag(c, &dir)
	c.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (0: wait for the end)")
	return c
}
