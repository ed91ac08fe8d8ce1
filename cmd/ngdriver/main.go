// Command ngdriver is the host driver of checkpointable agent-harness
// rollouts: bookmarks, the stage machine, the adapters and the sandbox
// backends. It drives ngsup inside each sandbox through sandbox exec.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "ngdriver: not built yet (see issue 3)")
	os.Exit(1)
}
