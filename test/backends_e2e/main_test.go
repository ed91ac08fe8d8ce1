package backends_e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/ngharness/ngharness/internal/cgrouptest"
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
	dir, err := testkit.Build("ngsup", "ngdriver", "docker", "kubectl")
	defer testkit.RemoveBuilt()
	if err != nil {
		fmt.Fprintln(os.Stderr, "backends_e2e:", err)
		return 1
	}
	binDir, ngsupPath, ngdriverPath = dir, testkit.Bin("ngsup"), testkit.Bin("ngdriver")
	docker := testkit.Bin("docker")
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
