package opencodee2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/internal/testkit"
)

// openCodeVersions are the OpenCode versions the suite runs against, each
// as a subtest of every test that needs OpenCode (TestX/1.17.11, ...), in
// this order: the version the seed was validated on, then the newer one.
// scripts/install-opencode.sh installs them all by default.
var openCodeVersions = []string{"1.17.11", "1.18.33"}

const (
	// toolsEnv, when set, is the folder holding the installs of
	// scripts/install-opencode.sh (opencode-<version>/) instead of the
	// module's .tools.
	toolsEnv = "OPENCODE_E2E_TOOLS"
	// childEnv is set in the test binary TestMissingOpenCode runs: it
	// builds nothing.
	childEnv = "OPENCODE_E2E_CHILD"
	// verboseEnv, when set, copies every world's log (driver, owner, fake
	// model) to stderr as it is written.
	verboseEnv = "OPENCODE_E2E_VERBOSE"
)

// suite is the test process's setup: TestMain builds the static ngsup and
// ngresume (nothing in the child TestMissingOpenCode runs) and reports the
// versions that are not installed.
var suite = &harnesstest.Suite{
	Name:       "opencode_e2e",
	TagPrefix:  "oce2e",
	Binaries:   []string{"ngsup", "ngresume", "ngdriver"},
	SkipBuild:  os.Getenv(childEnv) != "",
	VerboseEnv: verboseEnv,
	Patience:   patience,
}

func TestMain(m *testing.M) {
	// TestMissingOpenCode and TestWrongOpenCodeVersion run this binary
	// again and wait for it to exit.
	testkit.HelperExitsAtOnce()
	suite.BeforeRun = reportMissing // it reads suite: set here, not in suite's initializer
	os.Exit(suite.Main(m))
}

// openCode is one installed OpenCode version a subtest runs.
type openCode struct {
	version string
	bin     string // the binary, absolute
}

// openCodePath is where scripts/install-opencode.sh installs version's
// binary (under OPENCODE_E2E_TOOLS if set).
func openCodePath(version string) string {
	tools := os.Getenv(toolsEnv)
	if tools == "" {
		tools = filepath.Join(suite.ModuleRoot, ".tools")
	}
	arch := "x64"
	if runtime.GOARCH == "arm64" {
		arch = "arm64"
	}
	return filepath.Join(tools, "opencode-"+version, "node_modules", "opencode-linux-"+arch, "bin", "opencode")
}

// notInstalled says why version's binary cannot run ("" when it is an
// executable file), in the one line a test skips or fails with.
func notInstalled(version string) string {
	bin := openCodePath(version)
	st, err := os.Stat(bin)
	if err == nil && (!st.Mode().IsRegular() || st.Mode()&0o111 == 0) {
		err = fmt.Errorf("not an executable file (mode %v)", st.Mode())
	}
	if err == nil {
		return ""
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // the path is in the message already
	}
	return fmt.Sprintf("real OpenCode %s is not installed at %s (%v): install it with `scripts/install-opencode.sh %s`",
		version, bin, err, version)
}

// reportMissing prints one line for each version that is not installed,
// saying whether its subtests fail (CI is set) or skip.
func reportMissing() {
	verdict := "its subtests skip"
	if os.Getenv("CI") != "" {
		verdict = "its subtests fail (CI is set)"
	}
	for _, v := range openCodeVersions {
		if msg := notInstalled(v); msg != "" {
			fmt.Printf("opencode_e2e: %s; %s\n", msg, verdict)
		}
	}
}

// versionChecks runs each binary's --version once per test process.
var versionChecks sync.Map // version -> func() error

// checkVersion fails unless bin reports version: a subtest named for a
// version runs that version.
func checkVersion(version, bin string) error {
	f, _ := versionChecks.LoadOrStore(version, sync.OnceValue(func() error {
		scratch, err := os.MkdirTemp("", suite.RunTag+"-version-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(scratch)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// In a scratch HOME, as every OpenCode the tests run on the host:
		// even --version makes folders under HOME.
		cmd := exec.CommandContext(ctx, bin, "--version")
		cmd.Env, cmd.Dir = hostEnv(scratch, filepath.Join(scratch, "data")), scratch
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		out, err := cmd.Output()
		if got := strings.TrimSpace(string(out)); err != nil || got != version {
			return fmt.Errorf("%s --version printed %q (%v), want %s: reinstall it with `scripts/install-opencode.sh %s`", bin, got, err, version, version)
		}
		return nil
	}))
	return f.(func() error)()
}

// forEachOpenCode runs body once per version of openCodeVersions, each as
// a parallel subtest named for the version, with that version's binary.
// A version that is not installed fails its subtest if CI is set and skips
// it otherwise, naming the install script. The tests also need root (the
// local sandboxes' mount namespaces).
func forEachOpenCode(t *testing.T, body func(t *testing.T, oc openCode)) {
	t.Helper()
	for _, v := range openCodeVersions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			body(t, openCodeBin(t, v))
		})
	}
}

// openCodeBin is version's installed binary, for forEachOpenCode.
func openCodeBin(t *testing.T, version string) openCode {
	t.Helper()
	if msg := notInstalled(version); msg != "" {
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	harnesstest.RequireRoot(t)
	bin := openCodePath(version)
	if err := checkVersion(version, bin); err != nil {
		t.Fatal(err)
	}
	if suite.BinDir == "" {
		t.Fatal("ngsup and ngresume were not built (TestMain builds them unless " + childEnv + " is set)")
	}
	return openCode{version: version, bin: bin}
}
