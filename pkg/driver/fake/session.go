package fake

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// StepsFile is the fake harness's saved session, in its session folder:
// one line a step taken ("step N"), appended as each is taken. A relaunch
// on the session continues after its last line.
const StepsFile = "steps"

// ParseSteps is the steps a steps file holds: its lines, empty ones left
// out.
func ParseSteps(data []byte) []string {
	steps := []string{}
	for _, l := range strings.Split(string(data), "\n") {
		if l != "" {
			steps = append(steps, l)
		}
	}
	return steps
}

// StepLines are the lines the harness writes to its steps file for steps
// from to to: "step from" ... "step to".
func StepLines(from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("step %d", i))
	}
	return out
}

// ReadSteps reads the steps of the session whose folder is sessionDir on
// this machine (for a local sandbox, the host path of the folder its
// State names). It is the one reader of the steps file for the tests; a
// session that has taken no step yet has no file, an error wrapping
// fs.ErrNotExist.
func ReadSteps(sessionDir string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(sessionDir, StepsFile))
	if err != nil {
		return nil, err
	}
	return ParseSteps(data), nil
}

// Steps is the numbers of the steps the session at sessionDir has taken,
// in order (N of each "step N" line; none when its file cannot be read).
func Steps(sessionDir string) []int {
	steps, _ := ReadSteps(sessionDir)
	var out []int
	for _, line := range steps {
		var n int
		if _, err := fmt.Sscanf(line, "step %d", &n); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// PidsFile is where the fake harness records, in its session folder, each
// process it starts: one line "KIND PID" a process (harness, child,
// own_session, daemon, untagged), pids as the sandbox sees them. Tests
// read it to prove a stop left none of them.
const PidsFile = "pids"

// Recorded is one line of a pids file.
type Recorded struct {
	Kind string // harness, child, own_session, daemon, untagged
	PID  int
}

// ReadPids reads the pids file of the session whose folder is sessionDir
// on this machine, in order; lines of another shape are left out.
func ReadPids(sessionDir string) ([]Recorded, error) {
	data, err := os.ReadFile(filepath.Join(sessionDir, PidsFile))
	if err != nil {
		return nil, err
	}
	var out []Recorded
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if pid, err := strconv.Atoi(f[1]); err == nil && pid > 0 {
			out = append(out, Recorded{Kind: f[0], PID: pid})
		}
	}
	return out, nil
}
