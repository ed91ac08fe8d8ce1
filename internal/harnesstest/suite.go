// Package harnesstest is what the end-to-end test packages of the real
// harnesses (test/codex_e2e, test/claude_e2e, test/pi_e2e,
// test/opencode_e2e) share:
// the test process's setup and last look (Suite: the module root, the
// static ngsup and friends built once, the leak check over the whole
// process), the world of one test (World, built on a drivertest.Env: the
// Env's local backend in a folder named for RunTag, its lending owner,
// ngsup, log and cleanup; and the World's own fake model server, Observer,
// runners, waits, checkpoints, looks at a paused launch), the leak checks (on
// internal/proctest, the tests' one /proc reader), and the matrix every real harness passes (matrix.go:
// PauseMidTool, PauseHeldReply, PauseMidStream, TwoRolloutsApart,
// CrashBeforeResponse, HostileTask, RunVerified). What differs between
// harnesses (the adapter, the harness binary, its script, what is read of
// its session) stays in each package; a package passes it in through
// Suite, WorldOptions and Harness, and runs each matrix body from a test
// of its own name. Processes are ended by pid (pidfd) or through `ngsup
// stop`, never by name.
package harnesstest

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/cgrouptest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

// Suite is one e2e test package's process-wide setup, filled in by Main.
type Suite struct {
	// Name names the package in the lines it prints ("codex_e2e").
	Name string
	// TagPrefix starts RunTag ("cxe2e"): the name of every rollout and
	// base folder of this test process starts with RunTag.
	TagPrefix string
	// Binaries are the programs of the module Main builds into BinDir
	// (testkit.Build: "ngsup", "ngresume", "ngdriver"). ngsup must be
	// among them.
	Binaries []string
	// SkipBuild, when set, makes Main build nothing (BinDir and NgsupHost
	// stay empty).
	SkipBuild bool
	// BeforeRun, if set, runs once the setup is done, before the tests.
	BeforeRun func()
	// VerboseEnv names the variable that, when set, copies every world's
	// log (driver, owner, fake model) to stderr as it is written.
	VerboseEnv string
	// Patience bounds every wait on something that should happen:
	// generous, never an assertion about speed. Main makes it
	// testkit.Patience, the bound of testkit.Eventually.
	Patience time.Duration

	// ModuleRoot is the folder of go.mod (set by Main).
	ModuleRoot string
	// BinDir holds the built Binaries (set by Main).
	BinDir string
	// NgsupHost is the built ngsup, run on the host for `ngsup tree` (set
	// by Main).
	NgsupHost string
	// RunTag starts the name of every rollout and base folder of this test
	// process, so that the final check finds what it left, and only that
	// (set by Main).
	RunTag string
}

// Main is the body of the package's TestMain; it returns the exit code.
// It skips on anything but Linux, finds the module root two levels above
// the package, builds the Binaries (unless SkipBuild), runs the tests,
// then removes the empty cgroups of the process's launches and takes the
// last look: a process tagged by one of its launches, or running in one
// of its sandboxes, is a leak (killed by pidfd, and the code is 1).
func (s *Suite) Main(m *testing.M) int {
	if runtime.GOOS != "linux" {
		fmt.Printf("%s: skipped, these tests need Linux (/proc, mount namespaces)\n", s.Name)
		return 0
	}
	root, err := testkit.ModuleRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", s.Name, err)
		return 1
	}
	s.ModuleRoot = root
	testkit.Patience = s.Patience
	s.RunTag = fmt.Sprintf("%s%d", s.TagPrefix, os.Getpid())
	if !s.SkipBuild {
		dir, err := testkit.Build(s.Binaries...)
		defer testkit.RemoveBuilt()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", s.Name, err)
			return 1
		}
		s.BinDir = dir
		s.NgsupHost = testkit.Bin("ngsup")
	}
	if s.BeforeRun != nil {
		s.BeforeRun()
	}
	code := m.Run()
	// The empty cgroups of launches whose sandbox a test removed.
	cgrouptest.RemoveEmpty(s.RunTag)
	// Every test stops what it started; this is the last look, over the
	// whole test process.
	if left := Leftovers(func(p ProcInfo) bool {
		return strings.Contains(p.Tag, s.RunTag) || strings.Contains(p.MountRoot, s.RunTag)
	}); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "%s: processes left after the tests: %s\n", s.Name, DescribeAll(left))
		for _, p := range left {
			KillIdentified(p)
		}
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Tree is `ngsup tree` of the launch whose folder is at hostDir, run with
// the suite's built ngsup.
func (s *Suite) Tree(hostDir string) (proto.TreeResult, error) { return Tree(s.NgsupHost, hostDir) }

// RequireRoot skips t unless the test process runs as root (the local
// sandboxes' mount namespaces need it).
func RequireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("these tests need root: local sandboxes in mount namespaces of their own")
	}
}

// InstalledBinary is the harness binary the tests run: the one the
// environment variable env names if set, else def (where the install
// script puts it). When it is not an executable file the test fails if CI
// is set and skips otherwise, with one line naming what (the harness and
// its version) and the install command. The tests also need root
// (RequireRoot).
func InstalledBinary(t *testing.T, what, env, def, install string) string {
	t.Helper()
	bin := Installed(t, what, env, def, install)
	RequireRoot(t)
	return bin
}

// Installed is InstalledBinary without the need for root: for the tests
// of an adapter that run its harness on the host, outside any sandbox.
func Installed(t *testing.T, what, env, def, install string) string {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		bin = def
	}
	st, err := os.Stat(bin)
	if err == nil && (!st.Mode().IsRegular() || st.Mode()&0o111 == 0) {
		err = fmt.Errorf("not an executable file (mode %v)", st.Mode())
	}
	if err != nil {
		msg := fmt.Sprintf("%s is not installed at %s (%v): install it with `%s`", what, bin, err, install)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}
