package claudee2e

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

const (
	// claudeVersion is the Claude Code these tests run (pinned in
	// scripts/install-harnesses.sh).
	claudeVersion = "2.1.332"
	// binEnv, when set, is the claude binary to run instead of the one
	// scripts/install-harnesses.sh installs into .tools/.
	binEnv = "CLAUDE_E2E_BIN"
	// verboseEnv, when set, copies every world's log (driver, owner, fake
	// model) to stderr as it is written.
	verboseEnv = "CLAUDE_E2E_VERBOSE"
)

// suite is the test process's setup: TestMain builds the static ngsup.
var suite = &harnesstest.Suite{
	Name:       "claude_e2e",
	TagPrefix:  "cle2e",
	Binaries:   []string{"ngsup", "ngdriver"},
	VerboseEnv: verboseEnv,
	Patience:   patience,
}

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// claudeBin is the installed Claude Code's native binary. When it is
// missing the test fails if CI is set and skips otherwise, with one line
// naming the install script. The tests also need root (the local
// sandboxes' mount namespaces).
func claudeBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv(binEnv)
	if bin == "" {
		arch := "x64"
		if runtime.GOARCH == "arm64" {
			arch = "arm64"
		}
		bin = filepath.Join(suite.ModuleRoot, ".tools", "claude-"+claudeVersion, "node_modules", "@anthropic-ai", "claude-code-linux-"+arch, "claude")
	}
	st, err := os.Stat(bin)
	if err == nil && (!st.Mode().IsRegular() || st.Mode()&0o111 == 0) {
		err = fmt.Errorf("not an executable file (mode %v)", st.Mode())
	}
	if err != nil {
		msg := fmt.Sprintf("Claude Code %s is not installed at %s (%v): install it with `scripts/install-harnesses.sh claude`", claudeVersion, bin, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	harnesstest.RequireRoot(t)
	return bin
}
