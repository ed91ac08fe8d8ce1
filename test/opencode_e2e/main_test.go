package opencodee2e

import (
	"context"
	"errors"
	"flag"
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

	"github.com/ngharness/ngharness/internal/cgrouptest"
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

var (
	// moduleRoot is the folder of go.mod.
	moduleRoot string
	// binDir holds ngsup-linux-<GOARCH> and ngresume-linux-<GOARCH>, the
	// names launch.FindBinaries looks for.
	binDir string
	// ngsupHost is the built ngsup, run on the host for `ngsup tree`.
	ngsupHost string
	// runTag starts the name of every rollout and base folder of this test
	// process, so that the final check finds what it left, and only that.
	runTag string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	flag.Parse()
	if runtime.GOOS != "linux" {
		fmt.Println("opencode_e2e: skipped, these tests need Linux (/proc, mount namespaces)")
		return 0
	}
	root, err := findModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "opencode_e2e:", err)
		return 1
	}
	moduleRoot = root
	runTag = fmt.Sprintf("oce2e%d", os.Getpid())
	if os.Getenv(childEnv) == "" {
		dir, err := os.MkdirTemp("", "opencode-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "opencode_e2e:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, name := range []string{"ngsup", "ngresume"} {
			out := filepath.Join(dir, name+"-linux-"+runtime.GOARCH)
			if err := buildStatic(root, out, "./cmd/"+name); err != nil {
				fmt.Fprintln(os.Stderr, "opencode_e2e:", err)
				return 1
			}
		}
		binDir = dir
		ngsupHost = filepath.Join(dir, "ngsup-linux-"+runtime.GOARCH)
	}
	reportMissing()
	code := m.Run()
	// The empty cgroups of launches whose sandbox a test removed.
	cgrouptest.RemoveEmpty(runTag)
	// Every test stops what it started; this is the last look, over the
	// whole test process: a process tagged by one of its launches, or
	// running in one of its sandboxes, is a leak.
	if left := leftovers(func(p procInfo) bool {
		return strings.Contains(p.tag, runTag) || strings.Contains(p.mountRoot, runTag)
	}); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "opencode_e2e: processes left after the tests: %s\n", describeAll(left))
		for _, p := range left {
			killIdentified(p)
		}
		if code == 0 {
			code = 1
		}
	}
	return code
}

// findModuleRoot is the folder of go.mod, two levels above this package.
func findModuleRoot() (string, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(data), "module github.com/ngharness/ngharness") {
		return "", fmt.Errorf("cannot find the module root above %s", root)
	}
	return root, nil
}

// buildStatic builds pkg into out as `make build` does: static (no cgo),
// -trimpath, for this machine's architecture.
func buildStatic(root, out, pkg string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v\n%s", pkg, err, msg)
	}
	return nil
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
		tools = filepath.Join(moduleRoot, ".tools")
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
		scratch, err := os.MkdirTemp("", runTag+"-version-")
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
	if os.Geteuid() != 0 {
		t.Skip("these tests need root: local sandboxes in mount namespaces of their own")
	}
	bin := openCodePath(version)
	if err := checkVersion(version, bin); err != nil {
		t.Fatal(err)
	}
	if binDir == "" {
		t.Fatal("ngsup and ngresume were not built (TestMain builds them unless " + childEnv + " is set)")
	}
	return openCode{version: version, bin: bin}
}
