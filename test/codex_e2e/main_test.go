package codexe2e

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

const (
	// codexVersion is the Codex CLI these tests run (pinned in
	// scripts/install-harnesses.sh).
	codexVersion = "0.171.0"
	// binEnv, when set, is the codex binary to run instead of the one
	// scripts/install-harnesses.sh installs into .tools/.
	binEnv = "CODEX_E2E_BIN"
	// verboseEnv, when set, copies every world's log (driver, owner, fake
	// model) to stderr as it is written.
	verboseEnv = "CODEX_E2E_VERBOSE"
)

// suite is the test process's setup: TestMain builds the static ngsup.
var suite = &harnesstest.Suite{
	Name:       "codex_e2e",
	TagPrefix:  "cxe2e",
	Binaries:   []string{"ngsup", "ngdriver"},
	VerboseEnv: verboseEnv,
	Patience:   patience,
}

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// codexBin is the installed Codex CLI's native binary
// (harnesstest.InstalledBinary: CODEX_E2E_BIN if set; missing, the test
// fails if CI is set and skips otherwise, naming the install script).
func codexBin(t *testing.T) string {
	t.Helper()
	arch, triple := "x64", "x86_64-unknown-linux-musl"
	if runtime.GOARCH == "arm64" {
		arch, triple = "arm64", "aarch64-unknown-linux-musl"
	}
	def := filepath.Join(suite.ModuleRoot, ".tools", "codex-"+codexVersion, "node_modules", "@openai", "codex-linux-"+arch, "vendor", triple, "bin", "codex")
	return harnesstest.InstalledBinary(t, "Codex CLI "+codexVersion, binEnv, def, "scripts/install-harnesses.sh codex")
}
