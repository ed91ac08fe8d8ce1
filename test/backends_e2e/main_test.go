package backends_e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ngharness/ngharness/internal/cgrouptest"
	"github.com/ngharness/ngharness/internal/fake/cli/build"
	"github.com/ngharness/ngharness/internal/testkit"
)

var (
	// binDir holds what TestMain built: ngsup-linux-<GOARCH>, ngdriver, and the fake
	// docker and kubectl, which are first on PATH.
	binDir string
	// ngsupPath is the static ngsup; ngdriverPath is ngdriver, beside it.
	ngsupPath, ngdriverPath string
	// runTag is in every rollout id of this test process.
	runTag string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	flag.Parse()
	if runtime.GOOS != "linux" {
		fmt.Println("backends_e2e: skipped, these tests need Linux")
		return 0
	}
	dir, err := os.MkdirTemp("", "ngharness-backends-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "backends_e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	ngsupPath = filepath.Join(dir, "ngsup-linux-"+runtime.GOARCH)
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", ngsupPath, "github.com/ngharness/ngharness/cmd/ngsup")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "backends_e2e: build ngsup: %v\n%s", err, out)
		return 1
	}
	ngdriverPath = filepath.Join(dir, "ngdriver")
	cmd = exec.Command(goBin, "build", "-trimpath", "-o", ngdriverPath, "github.com/ngharness/ngharness/cmd/ngdriver")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "backends_e2e: build ngdriver: %v\n%s", err, out)
		return 1
	}
	docker, _, err := build.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "backends_e2e:", err)
		return 1
	}
	// The fake docker and kubectl come first on PATH: the backends find
	// them by name, as they would the real ones.
	os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	if p, err := exec.LookPath("docker"); err != nil || p != docker {
		fmt.Fprintf(os.Stderr, "backends_e2e: docker on PATH is %q (%v), not the fake %s\n", p, err, docker)
		return 1
	}
	runTag = fmt.Sprintf("bk%d", os.Getpid())
	testkit.Patience = Patience
	code := m.Run()
	// A sandbox deleted behind the owner's back (TestSandboxDeletedMidRun)
	// leaves its launch's empty cgroup: a real service would take it along.
	cgrouptest.RemoveEmpty(runTag)
	return code
}
