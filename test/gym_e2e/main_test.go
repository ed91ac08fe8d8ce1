package gyme2e

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
	// fakemodelBin is the fake model (internal/fake/model/cmd/fakemodel), the
	// deployment's policy model taking part in checkpoints.
	fakemodelBin string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	flag.Parse()
	if runtime.GOOS != "linux" {
		fmt.Println("gym_e2e: skipped, these tests need Linux (/proc, process groups, mount namespaces)")
		return 0
	}
	dir, err := testkit.Build("ngdriver", "ngsup", "fakemodel")
	if err != nil {
		fmt.Fprintln(os.Stderr, "gym_e2e:", err)
		testkit.RemoveBuilt()
		return 1
	}
	binDir, ngdriverBin, ngsupBin, fakemodelBin = dir, testkit.Bin("ngdriver"), testkit.Bin("ngsup"), testkit.Bin("fakemodel")
	testkit.Patience = waitLimit
	return testkit.Main(m)
}
