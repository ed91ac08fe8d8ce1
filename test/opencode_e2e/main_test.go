package opencodee2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/cgrouptest"
)

const (
	// openCodeVersion is the OpenCode these tests run (the version the
	// seed was validated on).
	openCodeVersion = "1.17.11"
	// binEnv, when set, is the opencode binary to run instead of the one
	// scripts/install-opencode.sh installs into .tools/.
	binEnv = "OPENCODE_E2E_BIN"
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

// openCodeBin is the installed OpenCode binary. When it is missing the test
// fails if CI is set and skips otherwise, naming the install script. The
// tests also need root (the local sandboxes' mount namespaces).
func openCodeBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv(binEnv)
	if bin == "" {
		arch := "x64"
		if runtime.GOARCH == "arm64" {
			arch = "arm64"
		}
		bin = filepath.Join(moduleRoot, ".tools", "opencode-"+openCodeVersion, "node_modules", "opencode-linux-"+arch, "bin", "opencode")
	}
	st, err := os.Stat(bin)
	if err == nil && (!st.Mode().IsRegular() || st.Mode()&0o111 == 0) {
		err = fmt.Errorf("not an executable file (mode %v)", st.Mode())
	}
	if err != nil {
		msg := fmt.Sprintf("real OpenCode %s is not installed at %s (%v): install it with `scripts/install-opencode.sh %s`",
			openCodeVersion, bin, err, openCodeVersion)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if os.Geteuid() != 0 {
		t.Skip("these tests need root: local sandboxes in mount namespaces of their own")
	}
	if binDir == "" {
		t.Fatal("ngsup and ngresume were not built (TestMain builds them unless " + childEnv + " is set)")
	}
	return bin
}
