package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/pkg/reaper"
)

func newTreeCmd() *cobra.Command {
	var dir string
	var pid int
	var asJSON bool
	c := &cobra.Command{
		Use:   "tree (--dir D | --pid PID) [--json]",
		Short: "Show the launch's processes as a tree",
		Long: `Show the processes of the launch in D (or PID and its descendants) as a tree:
pid, ppid, pgid, sid, state, start time (clock ticks) and command. Readable by
default; --json prints one line for programs. Nothing is signalled.`,
		Args: noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if (dir == "") == (pid == 0) {
				return usagef("tree needs exactly one of --dir or --pid")
			}
			if pid < 0 {
				return usagef("--pid %d is not a process id", pid)
			}
			var t proto.TreeResult
			var err error
			if dir != "" {
				t, err = reaper.Tree(dir)
			} else {
				t, err = reaper.TreeFromPID(pid)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return result(t, proto.ExitOK, nil)
			}
			return reaper.RenderTree(os.Stdout, t)
		},
	}
	addDirFlag(c, &dir)
	c.Flags().IntVar(&pid, "pid", 0, "show this process and its descendants instead of a launch")
	c.Flags().BoolVar(&asJSON, "json", false, "print one line of JSON")
	return c
}
