// Command ngsup is the in-sandbox supervisor of one harness launch: it runs
// the harness as a child subreaper, keeps the launch's receipt on the
// sandbox's disk, and answers pause, continue, stop, wait, status and tree.
// Machine output is one line of JSON on stdout; messages go to stderr. The
// command line is a contract (docs/ngsup.md): verbs, flags, files and exit codes
// are not renamed. What each verb does in each state of a launch is
// pkg/reaper's verb x state table; a verb that cannot act in a state says
// "cannot X a launch in state Y" on stderr.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/proto"
)

func main() {
	os.Exit(execute(os.Args[1:]))
}

// exitError carries a verb's exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

// usageError marks a bad command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

func execute(args []string) int {
	root := newRoot()
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return proto.ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(os.Stderr, "ngsup: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(os.Stderr, "ngsup: %v\n", err)
	return exitCodeFor(err)
}

// exitCodeFor maps an error class to the contract's exit code: bad input and
// unreadable launch folders are 2, anything else 1.
func exitCodeFor(err error) int {
	var ue usageError
	switch {
	case errors.As(err, &ue),
		errors.Is(err, proto.ErrBadDir),
		errors.Is(err, proto.ErrBadID),
		errors.Is(err, proto.ErrNoLaunch),
		errors.Is(err, proto.ErrCorruptReceipt),
		errors.Is(err, proto.ErrUnknownVersion),
		errors.Is(err, proto.ErrLaunchExists):
		return proto.ExitUsage
	}
	return proto.ExitInternal
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "ngsup",
		Short: "Supervise one agent-harness launch inside a sandbox",
		Long: `ngsup runs an agent harness as one launch inside a sandbox and holds it still
on demand. Every verb takes --dir, the launch's own folder (absolute path).
Machine output is one line of JSON on stdout; messages go to stderr.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{err.Error()}
	})
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(newRunCmd(), newWaitCmd(), newPauseCmd(), newContinueCmd(),
		newStopCmd(), newStatusCmd(), newTreeCmd(), newVersionCmd())
	return root
}

// printJSON writes v as one line of JSON on stdout.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// result prints v and turns a non-zero contract code into an exitError.
func result(v any, code int, err error) error {
	if err != nil {
		if code == proto.ExitOK {
			code = exitCodeFor(err)
		}
		return &exitError{code: code, err: err}
	}
	if perr := printJSON(v); perr != nil {
		return &exitError{code: proto.ExitInternal, err: perr}
	}
	if code != proto.ExitOK {
		return &exitError{code: code}
	}
	return nil
}

// noArgs rejects positional arguments with a usage error.
func noArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", c.Name(), args)
	}
	return nil
}

// addDirFlag adds the --dir flag every verb takes.
func addDirFlag(c *cobra.Command, dir *string) {
	c.Flags().StringVar(dir, "dir", "", "the launch's folder on the sandbox's disk (absolute path)")
}
