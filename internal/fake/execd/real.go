package execd

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// The environment that points the OpenSandbox tests (the backend's
// conformance suite, the backends_e2e opensandbox tests) at a real
// OpenSandbox server instead of this fake.
const (
	// RealURLEnv is the lifecycle server's URL, e.g. http://opensandbox:8080.
	RealURLEnv = "NGHARNESS_OPENSANDBOX_URL"
	// RealAPIKeyEnv is its API key (OPEN-SANDBOX-API-KEY).
	RealAPIKeyEnv = "NGHARNESS_OPENSANDBOX_API_KEY"
	// RealImageEnv is the image the tests' sandboxes are made from: a GNU
	// userland with bash (coreutils, procps-free is fine).
	RealImageEnv = "NGHARNESS_OPENSANDBOX_IMAGE"
	// RealRootEnv and RealWorkdirEnv, if set, are the backend's root and
	// workdir in those sandboxes (default /var/lib/ngharness, /workspace).
	RealRootEnv    = "NGHARNESS_OPENSANDBOX_ROOT"
	RealWorkdirEnv = "NGHARNESS_OPENSANDBOX_WORKDIR"
)

// Real names a real OpenSandbox server.
type Real struct {
	URL, APIKey, Image, Root, Workdir string
}

// RealServer reads RealURLEnv, RealAPIKeyEnv and RealImageEnv: ok is
// false when no URL is set (the tests use the fake); a URL without an
// image is an error naming what is missing.
func RealServer() (r Real, ok bool, err error) {
	r = Real{URL: os.Getenv(RealURLEnv), APIKey: os.Getenv(RealAPIKeyEnv), Image: os.Getenv(RealImageEnv),
		Root: os.Getenv(RealRootEnv), Workdir: os.Getenv(RealWorkdirEnv)}
	if r.URL == "" {
		return r, false, nil
	}
	if r.Image == "" {
		return r, true, fmt.Errorf("%s is set but %s is not: name the image the test sandboxes are made from", RealURLEnv, RealImageEnv)
	}
	return r, true, nil
}

// SkipIfReal is the line a fake-only test skips with when the tests run
// against a real server.
func SkipIfReal() string {
	if os.Getenv(RealURLEnv) == "" {
		return ""
	}
	return fmt.Sprintf("%s is set: this test needs the fake OpenSandbox (its fault modes or its view of the sandboxes from this machine)", RealURLEnv)
}

// RealLabel is the metadata key every sandbox the tests make on a server
// carries (Options.Metadata), its value the test process's own tag
// (RunLabel), so that at their end everything they made there is found
// and removed (opensandbox's Lifecycle.Sweep), even after a test failed
// half way.
const RealLabel = "ngharness-test"

// RunLabel is the value of RealLabel for this test process: its pid and
// start time.
var RunLabel = fmt.Sprintf("p%d-%d", os.Getpid(), time.Now().UnixNano())

// Lender is the opensandbox backend as an owner lends it, remembering
// every sandbox it made (Create, Fork), so that Sweep also finds the
// snapshots of the ones removed before the end.
type Lender struct {
	*opensandbox.Backend
	mu   sync.Mutex
	made []string
}

func (m *Lender) note(sb sandbox.Sandbox, err error) (sandbox.Sandbox, error) {
	if err == nil {
		m.mu.Lock()
		m.made = append(m.made, sb.ID())
		m.mu.Unlock()
	}
	return sb, err
}

// Create makes a sandbox (opensandbox.Backend.Create) and remembers it.
func (m *Lender) Create(ctx context.Context, name string) (sandbox.Sandbox, error) {
	return m.note(m.Backend.Create(ctx, name))
}

// Fork makes a sandbox from a snapshot (opensandbox.Backend.Fork) and
// remembers it.
func (m *Lender) Fork(ctx context.Context, snap, name string) (sandbox.Sandbox, error) {
	return m.note(m.Backend.Fork(ctx, snap, name))
}

// Made lists the sandboxes made, in order.
func (m *Lender) Made() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.made...)
}

// Sweep removes, through the lender's server, every sandbox labelled with
// this test process's RealLabel, every sandbox the lender made, and every
// snapshot taken of any of them.
func (m *Lender) Sweep(ctx context.Context) error {
	return m.Lifecycle().Sweep(ctx, map[string]string{RealLabel: RunLabel}, m.Made())
}
