package backends_e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/ngharness/ngharness/internal/testkit"
)

var (
	// ngsupPath is the static ngsup TestMain built; ngdriverPath is
	// ngdriver, beside it (the fake docker and kubectl too, first on PATH).
	ngsupPath, ngdriverPath string
	// runTag is in every rollout id this test process makes outside a
	// drivertest.Env (whose ids carry its own tag).
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
	ngsupPath, ngdriverPath = testkit.Bin("ngsup"), testkit.Bin("ngdriver")
	// The fake docker and kubectl come first on PATH: the backends (the
	// Envs' and ngdriver's) find them by name, as they would the real ones.
	os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, name := range []string{"docker", "kubectl"} {
		if p, err := exec.LookPath(name); err != nil || p != testkit.Bin(name) {
			fmt.Fprintf(os.Stderr, "backends_e2e: %s on PATH is %q (%v), not the fake %s\n", name, p, err, testkit.Bin(name))
			return 1
		}
	}
	runTag = fmt.Sprintf("bk%d", os.Getpid())
	return m.Run()
}
