package main

import (
	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/pkg/reaper"
)

func newStatusCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "status --dir D",
		Short: "Print the launch's receipt",
		Long: `Print the launch's receipt as one line of JSON. Exit 0, or 2 when there is no launch in D.
The cgroup of an ended launch is removed when nothing is left in it.`,
		Args: noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			r, err := reaper.Status(dir)
			return result(r, proto.ExitOK, err)
		},
	}
	addDirFlag(c, &dir)
	return c
}
