package e2e

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/ngharness/ngharness/internal/testkit"
)

var (
	// binDir holds the binaries TestMain built: ngdriver and
	// ngsup-linux-<GOARCH> beside it, as `make build` lays out bin/.
	binDir string
	// ngdriverBin and ngsupBin are their paths.
	ngdriverBin, ngsupBin string
	// runTag starts every rollout id of this test process, so no process
	// or launch of another test run is ever mistaken for ours.
	runTag string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	flag.Parse()
	if runtime.GOOS != "linux" {
		fmt.Println("e2e: skipped, these tests need Linux (/proc, process groups, mount namespaces)")
		return 0
	}
	dir, err := testkit.Build("ngdriver", "ngsup")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		testkit.RemoveBuilt()
		return 1
	}
	binDir, ngdriverBin, ngsupBin = dir, testkit.Bin("ngdriver"), testkit.Bin("ngsup")
	runTag = fmt.Sprintf("ngE2E%d", os.Getpid())
	testkit.Patience = waitLimit
	return testkit.Main(m)
}
