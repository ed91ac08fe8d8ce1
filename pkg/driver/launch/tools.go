package launch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// DefaultBinaries finds bin/ngsup-linux-<arch> beside the running program,
// or in dir when it is not empty.
func DefaultBinaries(dir string) map[string]string {
	return FindBinaries(dir, "ngsup")
}

// FindBinaries finds <name>-linux-<arch> in dir (default: beside the running
// program), by architecture.
func FindBinaries(dir, name string) map[string]string {
	if dir == "" {
		if exe, err := os.Executable(); err == nil {
			dir = path.Dir(exe)
		}
	}
	out := map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		p := path.Join(dir, name+"-linux-"+arch)
		if _, err := os.Stat(p); err == nil {
			out[arch] = p
		}
	}
	return out
}

// Tools uploads static helper binaries into sandboxes: once per sandbox,
// for the sandbox's architecture, to <root>/bin/<name>-<hash>, skipped when
// a file of that hash is already there (a fork of a snapshot has it). A
// sandbox whose backend shares tools across the host (sandbox.ToolSharer:
// the local backend) gets the backend's read-only copy instead, and its
// folder holds none.
type Tools struct {
	mu     sync.Mutex
	images map[string]toolImage // by host path
}

type toolImage struct {
	data []byte
	sum  string
}

// Ensure returns the path of the tool inside sb, uploading it if needed.
// binaries maps an architecture (GOARCH) to the host path of the build.
func (t *Tools) Ensure(ctx context.Context, sb sandbox.Sandbox, name string, binaries map[string]string) (string, error) {
	arch, err := Arch(ctx, sb)
	if err != nil {
		return "", err
	}
	p, ok := binaries[arch]
	if !ok {
		return "", fmt.Errorf("%w: %s for %s (build it with `make build`)", ErrNoNgsup, name, arch)
	}
	img, err := t.image(p)
	if err != nil {
		return "", err
	}
	if ts, ok := sandbox.AsToolSharer(sb); ok {
		// One read-only copy per host, not one in every sandbox (which
		// every snapshot and fork would copy again).
		dst, err := ts.SharedTool(ctx, name, img.data, img.sum)
		if err != nil {
			return "", fmt.Errorf("install %s for %s: %w", name, sb.ID(), err)
		}
		return dst, nil
	}
	dst := path.Join(sb.Root(), "bin", name+"-"+img.sum[:16])
	res, err := execRetry(ctx, sb, sandbox.ExecRequest{Argv: []string{"test", "-x", dst}, Timeout: 30 * time.Second, HostPaths: true})
	if err != nil {
		return "", fmt.Errorf("look for %s in %s: %w", name, sb.ID(), err)
	}
	if res.ExitCode != 0 {
		err := retry(ctx, func() error { return sb.Upload(ctx, dst, img.data, 0o755) }, transient)
		if err != nil {
			return "", fmt.Errorf("upload %s to %s: %w", name, sb.ID(), err)
		}
	}
	return dst, nil
}

func (t *Tools) image(p string) (toolImage, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if img, ok := t.images[p]; ok {
		return img, nil
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return toolImage{}, fmt.Errorf("read %s: %w", p, err)
	}
	sum := sha256.Sum256(data)
	img := toolImage{data: data, sum: hex.EncodeToString(sum[:])}
	if t.images == nil {
		t.images = map[string]toolImage{}
	}
	t.images[p] = img
	return img, nil
}

// Arch asks the sandbox for its machine and names it as Go does.
func Arch(ctx context.Context, sb sandbox.Sandbox) (string, error) {
	res, err := execRetry(ctx, sb, sandbox.ExecRequest{Argv: []string{"uname", "-m"}, Timeout: 30 * time.Second, HostPaths: true})
	if err != nil {
		return "", fmt.Errorf("ask %s for its architecture: %w", sb.ID(), err)
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("ask %s for its architecture: uname -m exited %d: %s", sb.ID(), res.ExitCode, stderrLine(res))
	}
	m := strings.TrimSpace(string(res.Stdout))
	switch m {
	case "x86_64", "amd64":
		return "amd64", nil
	case "aarch64", "arm64":
		return "arm64", nil
	}
	return "", fmt.Errorf("%w: the sandbox %s says its machine is %q", ErrNoNgsup, sb.ID(), m)
}
