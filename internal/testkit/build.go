package testkit

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// RaceEnv, when "1", makes Build give ngdriver the race detector (the
// servers an end-to-end test starts then report data races on their
// stderr).
const RaceEnv = "NGHARNESS_E2E_RACE"

// program is one program of the module the tests run: its package and its
// file name in the folder.
type program struct{ pkg, file string }

// programs are the programs Build knows, by name. The folder is laid out as
// `make build` lays out bin/: ngdriver beside ngsup-linux-<GOARCH> and
// ngresume-linux-<GOARCH>, the names launch.DefaultBinaries and
// launch.FindBinaries look for. docker and kubectl are one fake
// (internal/fake/cli), which acts by the name it runs under.
var programs = map[string]program{
	"ngsup":     {"./cmd/ngsup", "ngsup-linux-" + runtime.GOARCH},
	"ngresume":  {"./cmd/ngresume", "ngresume-linux-" + runtime.GOARCH},
	"ngdriver":  {"./cmd/ngdriver", "ngdriver"},
	"fakemodel": {"./internal/fake/model/cmd/fakemodel", "fakemodel"},
	"docker":    {"./internal/fake/cli", "docker"},
	"kubectl":   {"./internal/fake/cli", "kubectl"},
}

// built is the test process's folder of programs and what is in it.
var built struct {
	mu    sync.Mutex
	dir   string
	names map[string]bool
	pkgs  map[string]string // package -> the first file built from it
}

// Build builds each named program once per test process into the
// process's own temporary folder, as the Makefile builds them: static (no
// cgo), -trimpath, for this machine's architecture (ngdriver with the race
// detector if RaceEnv is "1"). It returns the folder; Bin names a program's
// file in it, and Main or RemoveBuilt removes it. A name Build does not
// know is an error naming the ones it knows.
func Build(names ...string) (string, error) {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir == "" {
		dir, err := os.MkdirTemp("", "ngharness-test-bin-")
		if err != nil {
			return "", fmt.Errorf("cannot make the folder of the built programs: %w", err)
		}
		built.dir, built.names, built.pkgs = dir, map[string]bool{}, map[string]string{}
	}
	var root string
	for _, name := range names {
		p, ok := programs[name]
		if !ok {
			return "", fmt.Errorf("cannot build %q: testkit builds only %s", name, strings.Join(slices.Sorted(maps.Keys(programs)), ", "))
		}
		if built.names[name] {
			continue
		}
		out := filepath.Join(built.dir, p.file)
		if from, ok := built.pkgs[p.pkg]; ok {
			// One fake under two names: a hard link.
			if err := os.Link(from, out); err != nil {
				return "", fmt.Errorf("cannot link %s as %s: %w", from, name, err)
			}
		} else {
			if root == "" {
				var err error
				if root, err = ModuleRoot(); err != nil {
					return "", err
				}
			}
			if err := goBuild(root, out, p.pkg, name == "ngdriver" && os.Getenv(RaceEnv) == "1"); err != nil {
				return "", err
			}
			built.pkgs[p.pkg] = out
		}
		built.names[name] = true
	}
	return built.dir, nil
}

// Bin is the file of a program Build built (or will build) in the test
// process's folder ("" before the first Build).
func Bin(name string) string {
	built.mu.Lock()
	defer built.mu.Unlock()
	p, ok := programs[name]
	if !ok || built.dir == "" {
		return ""
	}
	return filepath.Join(built.dir, p.file)
}

// RemoveBuilt removes the folder Build built into; a later Build starts a
// new one.
func RemoveBuilt() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
		built.dir = ""
	}
}

// goBuild builds pkg into out from the module at root; with race, with the
// race detector (which needs cgo).
func goBuild(root, out, pkg string, race bool) error {
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
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cannot build %s: go %s: %w\n%s", pkg, strings.Join(args, " "), err, msg)
	}
	if flag.Parsed() && testing.Verbose() {
		fmt.Printf("testkit: built %s in %s\n", filepath.Base(out), time.Since(begin).Round(time.Millisecond))
	}
	return nil
}
