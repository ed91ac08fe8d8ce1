package backends_e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// FullEnv, when "1", also runs the driver's whole test suite through the
// docker backend (it takes a few minutes more than through OpenSandbox).
const FullEnv = "BACKENDS_E2E_FULL"

// TestDriverSuiteThroughBackends runs the driver's whole test suite
// (pkg/driver: the stage machine, pauses, stops, crashes, restores,
// cancellations, leaving the sandbox, hostile text) with every exec,
// upload, create, snapshot, fork and remove going through the opensandbox
// backend and the fake OpenSandbox, and, with BACKENDS_E2E_FULL=1, through
// the docker backend and the fake docker too.
func TestDriverSuiteThroughBackends(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the driver's tests need root")
	}
	names := []string{"opensandbox"}
	if os.Getenv(FullEnv) == "1" {
		names = append(names, "docker")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(goBin, "test", "-count=1", "-timeout", "15m", "github.com/ngharness/ngharness/pkg/driver")
			// PATH already starts with the fake docker (TestMain).
			cmd.Env = append(os.Environ(), "DRIVERTEST_BACKEND="+name) // drivertest.BackendEnv
			out, err := cmd.CombinedOutput()
			if err != nil {
				s := string(out)
				if len(s) > 20000 {
					s = "..." + s[len(s)-20000:]
				}
				t.Fatalf("the driver's suite through %s failed: %v\n%s", name, err, s)
			}
			t.Logf("the driver's suite through %s: %s", name, strings.TrimSpace(string(out)))
		})
	}
}
