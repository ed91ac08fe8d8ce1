package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/pkg/reaper"
)

// severalDirsHelp is the part of pause's and continue's --help on several
// --dir (docs/ngsup.md, "Several launches in one call": one --dir behaves exactly
// as before).
const severalDirsHelp = `Several --dir (a driver batches the launches of one host this way): each
launch is handled as if it were named alone, on its own lock, up to %d at
once, and one line of JSON is printed per --dir, in the order given: the
object above plus "dir" (the --dir as given) and "code", the exit code that
launch alone would have had: %s,
or 2 or 1 with "error" naming a bad folder or an internal error. The exit
code is 0 when every code is 0, else the largest code. --id names one
launch and cannot be given with several --dir.`

func newPauseCmd() *cobra.Command {
	var dirs []string
	var opt reaper.PauseOptions
	c := &cobra.Command{
		Use:   "pause --dir D [--dir D2 ...]",
		Short: "Stop every process of the launch and confirm it",
		Long: `Create D/pause (so a launch that has not started waits), then stop every
process of the launch and confirm each is stopped (T), dead, or in an
uninterruptible call with SIGSTOP pending. Budgets: 5 s, and up to 30 s while the
only ones left are in an uninterruptible call.

Prints {"paused","processes","elapsed_ms","method","supervised","pending":[...]}.
Exit 0 paused; 3 the launch had already ended (its result is kept, nothing
paused); 4 not confirmed (pending lists pid, state and wchan; what was stopped
is continued again, and the caller falls back to stop).
A launch cgroup found frozen when the pause begins was left so by a pause that
died between freeze and thaw (the verbs take the folder's lock in turn): the
pause stops every member while it is frozen, thaws it, and says
"recovered_freeze":true. "skipped_lines" counts lines of the launch's
bookkeeping files that were not records (they are skipped).

` + fmt.Sprintf(severalDirsHelp, reaper.BatchWorkers, "0, 3 or 4"),
		Args: noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			quietGC()
			if len(dirs) > 1 {
				if c.Flags().Changed("id") {
					return usagef("--id names one launch: it cannot be given with %d --dir", len(dirs))
				}
				return pauseMany(dirs, opt)
			}
			return result(reaper.Pause(oneDir(dirs), opt))
		},
	}
	addDirsFlag(c, &dirs)
	c.Flags().BoolVar(&opt.NoCgroup, "no-cgroup", false, "never freeze the launch's cgroup (signals only, even in a fork storm)")
	c.Flags().BoolVar(&opt.CgroupFirst, "cgroup-first", false, "freeze the launch's cgroup before the first pass (default: only when a fork storm shows)")
	c.Flags().StringVar(&opt.ID, "id", "", "the launch id, for a launch run without a supervisor (no receipt): found by its tag (one --dir only)")
	c.Flags().DurationVar(&opt.StopBudget, "budget", reaper.StopBudget, "how long to wait for every process to stop")
	c.Flags().DurationVar(&opt.UninterruptibleBudget, "d-budget", reaper.UninterruptibleBudget, "how long to wait while only processes in uninterruptible calls are left")
	c.Flags().MarkHidden("budget")
	c.Flags().MarkHidden("d-budget")
	return c
}

// pauseMany pauses the launch in every dir and prints one PauseLine per
// dir, in order (see severalDirsHelp).
func pauseMany(dirs []string, opt reaper.PauseOptions) error {
	lines := make([]proto.PauseLine, len(dirs))
	return printLines(len(dirs), func(i int) int {
		res, code, err := reaper.Pause(dirs[i], opt)
		code = lineCode(code, err)
		if err != nil {
			res.Error = err.Error()
		}
		lines[i] = proto.PauseLine{Dir: dirs[i], Code: code, PauseResult: res}
		return code
	}, func(i int) (any, string) {
		if lines[i].Code == proto.ExitUsage || lines[i].Code == proto.ExitInternal {
			return lines[i], fmt.Sprintf("pause --dir %s: %s", dirs[i], lines[i].Error)
		}
		return lines[i], ""
	})
}

// addDirsFlag adds pause's and continue's --dir, which may be repeated.
func addDirsFlag(c *cobra.Command, dirs *[]string) {
	c.Flags().StringArrayVar(dirs, "dir", nil, "the launch's folder on the sandbox's disk (absolute path); repeat it to name several launches")
}

// oneDir is the only --dir given ("" when none, which the verb reports).
func oneDir(dirs []string) string {
	if len(dirs) == 0 {
		return ""
	}
	return dirs[0]
}

// lineCode is the exit code of one launch of several: the verb's code, or
// the class of its error.
func lineCode(code int, err error) int {
	if err != nil && code == proto.ExitOK {
		return exitCodeFor(err)
	}
	return code
}

// printLines handles n launch folders with reaper.Each: do(i) returns the
// code of folder i; line(i) returns its line and a message for stderr
// ("" for none). The lines are printed in order, each as soon as it and
// every one before it are done. It returns the exit code of the whole call:
// 0 when every code is 0, else the largest.
func printLines(n int, do func(i int) int, line func(i int) (any, string)) error {
	codes := make([]int, n)
	worst := proto.ExitOK
	var perr error
	reaper.Each(n, reaper.BatchWorkers, func(i int) { codes[i] = do(i) }, func(i int) {
		v, msg := line(i)
		if msg != "" {
			fmt.Fprintf(os.Stderr, "ngsup: %s\n", msg)
		}
		if err := printJSON(v); err != nil && perr == nil {
			perr = err
		}
		worst = max(worst, codes[i])
	})
	if perr != nil {
		return &exitError{code: proto.ExitInternal, err: perr}
	}
	if worst != proto.ExitOK {
		return &exitError{code: worst}
	}
	return nil
}

// verbHeapLimit is the heap past which a control verb's collector runs
// again (quietGC).
const verbHeapLimit = 128 << 20

// quietGC keeps the garbage collector out of a short control verb (pause,
// continue): a pause of 4,000 processes allocated enough for five
// collections, and on a loaded machine one collection's stop-the-world
// waited 54 ms for a thread to get a CPU (issue 22). What a verb holds grows
// with the launch, about 1 KB a process; the memory limit lets the collector
// run again should a verb (a batch of many launches) come near it.
func quietGC() {
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(verbHeapLimit)
}
