package pie2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

const (
	// piVersion is the Pi these tests run (pinned in
	// scripts/install-harnesses.sh).
	piVersion = "0.73.1"
	// binEnv, when set, is the pi command to run instead of the one
	// scripts/install-harnesses.sh installs into .tools/.
	binEnv = "PI_E2E_BIN"
	// verboseEnv, when set, copies every world's log (driver, owner, fake
	// model) to stderr as it is written.
	verboseEnv = "PI_E2E_VERBOSE"
)

// suite is the test process's setup: TestMain builds the static ngsup and
// ngdriver.
var suite = &harnesstest.Suite{
	Name:       "pi_e2e",
	TagPrefix:  "pie2e",
	Binaries:   []string{"ngsup", "ngdriver"},
	VerboseEnv: verboseEnv,
	Patience:   patience,
}

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// piBin is the installed pi command (harnesstest.InstalledBinary:
// PI_E2E_BIN if set; missing, the test fails if CI is set and skips
// otherwise, naming the install script).
func piBin(t *testing.T) string {
	t.Helper()
	def := filepath.Join(suite.ModuleRoot, ".tools", "pi-"+piVersion, "node_modules", ".bin", "pi")
	return harnesstest.InstalledBinary(t, "Pi "+piVersion, binEnv, def, "scripts/install-harnesses.sh pi")
}

// nodeBin is node on PATH, which runs the launcher (the harness process of
// every launch).
func nodeBin(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("Pi needs node, and there is none on PATH: %v", err)
	}
	return node
}
