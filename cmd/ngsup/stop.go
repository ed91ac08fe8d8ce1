package main

import (
	"fmt"
	"os"
	"strings"
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
--grace, then SIGKILL again to anything still found, until none is left.
Processes are found through the supervisor's tree, the harness's process group
and the launch's cgroup; the supervisor stays the subreaper of what the
harness left until none of it is left, so what a dying process forks comes
back to its tree. Only when the supervisor is gone (or never ran) does
stop search every process for the launch's tag, and what earlier passes
recorded: a stop never sweeps by tag while the supervisor lives, so a launch
elsewhere with the same id is left alone.

Prints {"stopped","interrupted","killed","elapsed_ms","method","supervised",
"survivors":[...],"searched":[...]}; "searched" names the sources used (tree,
group, cgroup, known, tag), "partial" is true when the supervisor's tree could
not be searched (then "stopped" means none of the other sources names a live
process: a process the supervisor had adopted and none of them names may be
left, and stderr says so). A stop bounds its own time: every sweep ends at its
phase's deadline (the grace, at least 1 s for the first; then 5 s of SIGKILL
sweeps, 2 s for the supervisor to record the end, 2 s for the confirming
sweep), so a fork storm cannot hold it for minutes; "out_of_time":true says a
bound cut it short (then "stopped" is false and the exit code 4). Where the
launch has a cgroup, the first sweep runs with it frozen, and each SIGKILL
sweep begins by killing the whole cgroup.

A folder that is a copy of the one the launch ran in (a snapshot or fork of
the sandbox brought it: its "origin" file, written when the launch was set up,
names another folder), once nothing its records name runs (the supervisor,
the harness, the known set, the cgroup), holds nothing to stop: nothing is
searched or signalled (no tag scan), and the reply says "copied":true with
"stopped":true (exit 0). While something they name runs, the stop goes on as
for any folder: the origin file is no way out of a stop.

With --id, a receipt that cannot be read (corrupt, or of an unknown version)
does not stop the stop: the launch is found by its tag, the receipt is left as
it is, and "receipt_error" says why it was not used.
Exit 0 none left, 4 survivors listed; 2 for a bad or unwritable launch folder
(nothing is stopped).`,
		Args: noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if grace < 0 {
				return usagef("--grace %s is negative", grace)
			}
			res, code, err := reaper.StopLaunch(dir, id, grace)
			if err == nil && res.ReceiptError != "" {
				fmt.Fprintf(os.Stderr, "ngsup: stop --dir %s: the receipt is unreadable, stopped by the launch's tag instead: %s\n", dir, res.ReceiptError)
			}
			if err == nil && res.Copied {
				fmt.Fprintf(os.Stderr, "ngsup: stop --dir %s: the folder is a copy of the one the launch ran in (a snapshot or fork brought it): nothing of the launch runs from here\n", dir)
			}
			if err == nil && res.Partial {
				fmt.Fprintf(os.Stderr, "ngsup: stop --dir %s: no supervisor lives (it is gone, or never ran), so its tree could not be searched (searched: %s)\n",
					dir, strings.Join(res.Searched, ", "))
			}
			return result(res, code, err)
		},
	}
	addDirFlag(c, &dir)
	c.Flags().DurationVar(&grace, "grace", reaper.DefaultGrace, "time between SIGINT and SIGKILL")
	c.Flags().StringVar(&id, "id", "", "the launch id, for a launch run without a supervisor (no receipt), or whose receipt is unreadable: found by its tag")
	return c
}
