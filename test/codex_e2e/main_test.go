package codexe2e

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

var (
	// moduleRoot is the folder of go.mod.
	moduleRoot string
	// binDir holds ngsup-linux-<GOARCH>, the name launch.FindBinaries
	// looks for.
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
		fmt.Println("codex_e2e: skipped, these tests need Linux (/proc, mount namespaces)")
		return 0
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		fmt.Fprintln(os.Stderr, "codex_e2e:", err)
		return 1
	}
	if data, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.Contains(string(data), "module github.com/ngharness/ngharness") {
		fmt.Fprintln(os.Stderr, "codex_e2e: cannot find the module root above", root)
		return 1
	}
	moduleRoot = root
	runTag = fmt.Sprintf("cxe2e%d", os.Getpid())
	dir, err := os.MkdirTemp("", "codex-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "codex_e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	ngsupHost = filepath.Join(dir, "ngsup-linux-"+runtime.GOARCH)
	if err := buildStatic(root, ngsupHost, "./cmd/ngsup"); err != nil {
		fmt.Fprintln(os.Stderr, "codex_e2e:", err)
		return 1
	}
	code := m.Run()
	// The empty cgroups of launches whose sandbox a test removed.
	cgrouptest.RemoveEmpty(runTag)
	// Every test stops what it started; this is the last look, over the
	// whole test process.
	if left := leftovers(func(p procInfo) bool {
		return strings.Contains(p.tag, runTag) || strings.Contains(p.mountRoot, runTag)
	}); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "codex_e2e: processes left after the tests: %s\n", describeAll(left))
		for _, p := range left {
			killIdentified(p)
		}
		if code == 0 {
			code = 1
		}
	}
	return code
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

// codexBin is the installed Codex CLI's native binary. When it is missing
// the test fails if CI is set and skips otherwise, with one line naming
// the install script. The tests also need root (the local sandboxes'
// mount namespaces).
func codexBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv(binEnv)
	if bin == "" {
		arch, triple := "x64", "x86_64-unknown-linux-musl"
		if runtime.GOARCH == "arm64" {
			arch, triple = "arm64", "aarch64-unknown-linux-musl"
		}
		bin = filepath.Join(moduleRoot, ".tools", "codex-"+codexVersion, "node_modules", "@openai", "codex-linux-"+arch, "vendor", triple, "bin", "codex")
	}
	st, err := os.Stat(bin)
	if err == nil && (!st.Mode().IsRegular() || st.Mode()&0o111 == 0) {
		err = fmt.Errorf("not an executable file (mode %v)", st.Mode())
	}
	if err != nil {
		msg := fmt.Sprintf("Codex CLI %s is not installed at %s (%v): install it with `scripts/install-harnesses.sh codex`", codexVersion, bin, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if os.Geteuid() != 0 {
		t.Skip("these tests need root: local sandboxes in mount namespaces of their own")
	}
	return bin
}
