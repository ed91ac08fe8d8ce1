package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/pkg/reaper"
)

func newContinueCmd() *cobra.Command {
	var dirs []string
	var id string
	c := &cobra.Command{
		Use:   "continue --dir D [--dir D2 ...]",
		Short: "Resume exactly what the last pause stopped",
		Long: `Thaw the launch's cgroup and send SIGCONT to exactly the processes the last
pause stopped (same pid AND start time), plus anything of the launch still
stopped, then remove D/pause. Exit 0, or 4 if something stays stopped.

Prints {"continued","skipped","elapsed_ms","method","pending":[...]}.

` + fmt.Sprintf(severalDirsHelp, reaper.BatchWorkers, "0 or 4"),
		Args: noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			quietGC()
			if len(dirs) > 1 {
				if c.Flags().Changed("id") {
					return usagef("--id names one launch: it cannot be given with %d --dir", len(dirs))
				}
				return continueMany(dirs)
			}
			return result(reaper.ContinueLaunch(oneDir(dirs), id))
		},
	}
	addDirsFlag(c, &dirs)
	c.Flags().StringVar(&id, "id", "", "the launch id, for a launch run without a supervisor (no receipt): found by its tag (one --dir only)")
	return c
}

// continueMany continues the launch in every dir and prints one
// ContinueLine per dir, in order (see severalDirsHelp).
func continueMany(dirs []string) error {
	lines := make([]proto.ContinueLine, len(dirs))
	return printLines(len(dirs), func(i int) int {
		res, code, err := reaper.Continue(dirs[i])
		code = lineCode(code, err)
		lines[i] = proto.ContinueLine{Dir: dirs[i], Code: code, ContinueResult: res}
		if err != nil {
			lines[i].Error = err.Error()
		}
		return code
	}, func(i int) (any, string) {
		if lines[i].Error != "" {
			return lines[i], fmt.Sprintf("continue --dir %s: %s", dirs[i], lines[i].Error)
		}
		return lines[i], ""
	})
}
