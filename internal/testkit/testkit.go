// Package testkit is what every test package of the module shares,
// whatever it tests: the one poll (Eventually, bounded by Patience), the one
// builder of the module's programs (Build and Bin: ngsup, ngdriver,
// ngresume, the fake model, the fake docker and kubectl, each built once
// per test process into one folder laid out as bin/), the module's root,
// and what a TestMain does with them (Main; HelperExitsAtOnce for a
// package whose tests run the test binary again). The /proc reader of
// the tests is its neighbour internal/proctest; the fakes are under
// internal/fake.
package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Main is the body of a package's TestMain: it builds the named programs
// (Build; a failure is printed and the code is 1), runs the tests, removes
// what Build built and returns the exit code, for os.Exit. A package that
// needs a program's path before the tests run (to put it on PATH, say)
// calls Build first: Main builds nothing twice.
func Main(m *testing.M, programs ...string) int {
	if len(programs) > 0 {
		if _, err := Build(programs...); err != nil {
			fmt.Fprintln(os.Stderr, err)
			RemoveBuilt()
			return 1
		}
	}
	code := m.Run()
	RemoveBuilt()
	return code
}

// HelperExitsAtOnce sets GORACE=atexit_sleep_ms=0, unless GORACE is set
// already, for the processes this one starts. Call it from the TestMain of
// a package whose tests run the test binary again as a helper process:
// built with -race, each such helper sleeps a second when it exits (the
// race runtime's atexit_sleep_ms, 1000 by default), and whoever waits for
// it pays that second.
func HelperExitsAtOnce() {
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
}

// modulePath is the module of go.mod.
const modulePath = "github.com/ngharness/ngharness"

// ModuleRoot is the folder of the module's go.mod: the nearest above the
// working folder (a test runs in its package's folder).
func ModuleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			if !strings.Contains(string(data), "module "+modulePath+"\n") {
				return "", fmt.Errorf("cannot find the module root: %s is not %s's", filepath.Join(dir, "go.mod"), modulePath)
			}
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("cannot find the module root: no go.mod above %s", wd)
		}
	}
}
