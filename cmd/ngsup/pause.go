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

` + fmt.Sprintf(severalDirsHelp, reaper.BatchWorkers, "0, 3 or 4") + `
Every launch's pause is begun (its lock taken, its pause file made, its
harness's process group sent SIGSTOP) before any is confirmed.`,
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
// dir, in order (see severalDirsHelp). Every pause is begun before any is
// confirmed (reaper.PauseAll).
func pauseMany(dirs []string, opt reaper.PauseOptions) error {
	var out lineOutput
	reaper.PauseAll(dirs, opt, reaper.BatchWorkers, func(i int, res proto.PauseResult, code int, err error) {
		code = lineCode(code, err)
		if err != nil {
			res.Error = err.Error()
		}
		msg := ""
		if code == proto.ExitUsage || code == proto.ExitInternal {
			msg = fmt.Sprintf("pause --dir %s: %s", dirs[i], res.Error)
		}
		out.print(proto.PauseLine{Dir: dirs[i], Code: code, PauseResult: res}, msg, code)
	})
	return out.result()
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
	var out lineOutput
	reaper.Each(n, reaper.BatchWorkers, func(i int) { codes[i] = do(i) }, func(i int) {
		v, msg := line(i)
		out.print(v, msg, codes[i])
	})
	return out.result()
}

// lineOutput prints the lines of a call naming several launches, in order,
// and keeps the call's exit code.
type lineOutput struct {
	worst int
	err   error
}

// print prints one launch's line (and msg, if any, on stderr) and counts
// its code.
func (o *lineOutput) print(v any, msg string, code int) {
	if msg != "" {
		fmt.Fprintf(os.Stderr, "ngsup: %s\n", msg)
	}
	if err := printJSON(v); err != nil && o.err == nil {
		o.err = err
	}
	o.worst = max(o.worst, code)
}

// result is the exit of the whole call: 0 when every code is 0, else the
// largest; 1 when a line could not be written.
func (o *lineOutput) result() error {
	if o.err != nil {
		return &exitError{code: proto.ExitInternal, err: o.err}
	}
	if o.worst != proto.ExitOK {
		return &exitError{code: o.worst}
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
