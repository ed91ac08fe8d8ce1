package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildOncePerProcess: the fake docker and kubectl are one build, two
// names (a hard link) in one folder; asking again builds nothing; a name
// Build does not know is an error naming the ones it knows; RemoveBuilt
// removes the folder.
func TestBuildOncePerProcess(t *testing.T) {
	dir, err := Build("docker", "kubectl")
	if err != nil {
		t.Fatal(err)
	}
	defer RemoveBuilt()
	docker, kubectl := Bin("docker"), Bin("kubectl")
	if docker != filepath.Join(dir, "docker") || kubectl != filepath.Join(dir, "kubectl") {
		t.Fatalf("Bin: %s %s, folder %s", docker, kubectl, dir)
	}
	a, errA := os.Stat(docker)
	b, errB := os.Stat(kubectl)
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		t.Fatalf("docker %v, kubectl %v: want one file under two names", errA, errB)
	}
	// The fake acts by the name it runs under.
	for _, bin := range []string{docker, kubectl} {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "FAKECLI_BASE="+t.TempDir())
		out, _ := cmd.CombinedOutput()
		if want := "fakecli: " + filepath.Base(bin) + " without a subcommand"; !strings.Contains(string(out), want) {
			t.Errorf("%s without arguments said %q, want %q", bin, out, want)
		}
	}
	again, err := Build("docker")
	if err != nil || again != dir {
		t.Fatalf("again: %s %v", again, err)
	}
	if c, _ := os.Stat(docker); !os.SameFile(a, c) {
		t.Error("the second Build built docker again")
	}
	if _, err := Build("nosuch"); err == nil || !strings.Contains(err.Error(), `"nosuch"`) || !strings.Contains(err.Error(), "docker, fakemodel, kubectl, ngdriver, ngresume, ngsup") {
		t.Errorf("unknown name: %v", err)
	}
	RemoveBuilt()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the folder is still there after RemoveBuilt: %v", err)
	}
	if Bin("docker") != "" {
		t.Errorf("Bin after RemoveBuilt: %q", Bin("docker"))
	}
}

// TestModuleRoot finds go.mod two levels up.
func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	if filepath.Join(root, "internal", "testkit") != wd {
		t.Errorf("root %s from %s", root, wd)
	}
}
