package gyme2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

var (
	// binDir holds the binaries TestMain built: ngdriver and
	// ngsup-linux-<GOARCH> beside it, as `make build` lays out bin/.
	binDir string
	// ngdriverBin and ngsupBin are their paths.
	ngdriverBin, ngsupBin string
)

// raceEnv, when "1", builds ngdriver with the race detector (the servers
// then report data races on their stderr, which every test checks).
const raceEnv = "NGHARNESS_E2E_RACE"

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	flag.Parse()
	if runtime.GOOS != "linux" {
		fmt.Println("gym_e2e: skipped, these tests need Linux (/proc, process groups, mount namespaces)")
		return 0
	}
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gym_e2e:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "ngharness-gym-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "gym_e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	ngdriverBin = filepath.Join(dir, "ngdriver")
	ngsupBin = filepath.Join(dir, "ngsup-linux-"+runtime.GOARCH)
	if err := build(root, ngdriverBin, "./cmd/ngdriver", os.Getenv(raceEnv) == "1"); err != nil {
		fmt.Fprintln(os.Stderr, "gym_e2e:", err)
		return 1
	}
	if err := build(root, ngsupBin, "./cmd/ngsup", false); err != nil {
		fmt.Fprintln(os.Stderr, "gym_e2e:", err)
		return 1
	}
	return m.Run()
}

// moduleRoot is the folder of go.mod, two levels above this package.
func moduleRoot() (string, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(data), "module github.com/ngharness/ngharness") {
		return "", fmt.Errorf("cannot find the module root above %s", root)
	}
	return root, nil
}

// build builds pkg into out as the Makefile does: static (no cgo),
// -trimpath; with race, the race detector (which needs cgo).
func build(root, out, pkg string, race bool) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	args := []string{"build", "-trimpath", "-o", out}
	if race {
		args = append(args, "-race")
	}
	args = append(args, pkg)
	cmd := exec.Command(goBin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if !race {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	begin := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if testing.Verbose() {
		fmt.Printf("gym_e2e: built %s in %s\n", filepath.Base(out), time.Since(begin).Round(time.Millisecond))
	}
	return nil
}
