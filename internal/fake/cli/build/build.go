// Package build builds the fake docker and kubectl (internal/fake/cli)
// for tests.
package build

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Build builds fakecli into dir as dir/docker and dir/kubectl (a hard
// link: it acts by the name it is run under) and returns their paths.
func Build(dir string) (docker, kubectl string, err error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	docker = filepath.Join(dir, "docker")
	kubectl = filepath.Join(dir, "kubectl")
	cmd := exec.Command(goBin, "build", "-o", docker, "github.com/ngharness/ngharness/internal/fake/cli")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("build the fake docker and kubectl: %v\n%s", err, out)
	}
	if err := os.Link(docker, kubectl); err != nil {
		return "", "", err
	}
	return docker, kubectl, nil
}
