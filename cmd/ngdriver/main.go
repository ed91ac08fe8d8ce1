// Command ngdriver is the host driver of checkpointable agent-harness
// rollouts: bookmarks, the stage machine, the adapters and the sandbox
// backends. It drives ngsup inside each sandbox through sandbox exec.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(execute(os.Args[1:]))
}

// usageError marks a bad command line (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func execute(args []string) int {
	root := &cobra.Command{
		Use:   "ngdriver",
		Short: "Run checkpointable agent-harness rollouts",
		Long: `ngdriver runs agent-harness rollouts in sandboxes so that a checkpoint can hold
each harness still (or stop it) and a crash can continue it from its bookmark in
a fork of the sandbox's snapshot.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err.Error()} })
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(newRunCmd(), newServeCmd(), newOwnerCmd())
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintf(os.Stderr, "ngdriver: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}
