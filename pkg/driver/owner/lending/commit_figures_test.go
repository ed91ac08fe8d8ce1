package lending

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// TestCommitFigures prints the owner's commit of N local sandboxes (the
// snapshot of every session's sandbox and the records written), as the
// soak's sandboxes hold them: ngsup as the driver puts it there (Ensure),
// a launch folder and the fake harness's state, a few KB. It is a
// benchmark, not a test: it runs only with NGHARNESS_BENCH_COMMIT=1 (as
// root, namespace isolation), N from NGHARNESS_BENCH_COMMIT_N (512), rounds
// from NGHARNESS_BENCH_COMMIT_ROUNDS (5), ngsup from NGHARNESS_BENCH_NGSUP
// (built when unset). docs/BENCHMARKS.md has the figures and f25039e's,
// taken by the same steps with that version's API (its localowner.Snapshot,
// ngsup uploaded as its driver did).
func TestCommitFigures(t *testing.T) {
	if os.Getenv("NGHARNESS_BENCH_COMMIT") != "1" {
		t.Skip("a benchmark: set NGHARNESS_BENCH_COMMIT=1")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespace isolation, as owner serve runs)")
	}
	n := envInt(t, "NGHARNESS_BENCH_COMMIT_N", 512)
	rounds := envInt(t, "NGHARNESS_BENCH_COMMIT_ROUNDS", 5)
	bin := os.Getenv("NGHARNESS_BENCH_NGSUP")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "ngsup")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "github.com/ngharness/ngharness/cmd/ngsup")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build ngsup: %v: %s", err, out)
		}
	}
	b, err := local.New(t.TempDir(), local.Options{Isolation: local.IsolationNamespace, MountPoint: filepath.Join(t.TempDir(), "mnt")})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, b: b}
	f.o = New(Options{Backend: b, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := context.Background()
	ng := &launch.Ngsup{Binaries: map[string]string{"amd64": bin, "arm64": bin}}
	begin := time.Now()
	for i := range n {
		key := fmt.Sprintf("bench%04d", i)
		raw, _ := json.Marshal(map[string]any{"task": "bench", "files": map[string]string{"task.txt": "the task\n"}})
		r, err := f.o.SeedSession(ctx, key, raw)
		if err != nil {
			t.Fatal(err)
		}
		sb := f.accessAt(key, r.Cookies)
		if _, err := ng.Ensure(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := fillLikeSoak(ctx, sb.Root(), sb.Workdir(), sb.Upload); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d sessions seeded in %s", n, time.Since(begin).Round(time.Millisecond))
	var took, cpu []time.Duration
	for r := range rounds {
		c0 := cpuTime()
		id := fmt.Sprintf("bench-%d", r)
		dir := filepath.Join(t.TempDir(), id)
		t0 := time.Now()
		if err := checkpoint(f.control(), id, dir); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(t0))
		cpu = append(cpu, cpuTime()-c0)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	slices.Sort(took)
	slices.Sort(cpu)
	fmt.Printf("commit of %d local sandboxes: CPU (the owner and what it ran) median %s, min %s\n", n, cpu[len(cpu)/2].Round(time.Millisecond), cpu[0].Round(time.Millisecond))
	fmt.Printf("commit of %d local sandboxes: median %s, min %s, max %s over %d rounds (prepare+commit+resume; load %s)\n",
		n, took[len(took)/2].Round(time.Millisecond), took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), rounds, bytesTrim(load))
}

// fillLikeSoak writes what a soak run leaves in its sandbox: a launch
// folder (the files ngsup keeps there) and the fake harness's state.
func fillLikeSoak(ctx context.Context, root, work string, upload func(context.Context, string, []byte, uint32) error) error {
	files := map[string]int{
		"launches/l-0001/receipt": 600, "launches/l-0001/known": 300, "launches/l-0001/stdout": 2048,
		"launches/l-0001/stderr": 512, "launches/l-0001/origin": 40, "launches/l-0001/supervisor.log": 400,
		"launches/l-0001/lock": 0, "launches/l-0001/pause": 0, "launches/l-0001/paused": 120,
		"launches/l-0001/paused-ns": 20, "launches/l-0001/stdin": 300,
		"state/fake/s-1/steps": 200, "state/fake/s-1/session.json": 1500, "bin/fake-harness.sh": 900,
	}
	for rel, size := range files {
		data := make([]byte, size)
		for i := range data {
			data[i] = 'a' + byte(i%26)
		}
		if err := upload(ctx, filepath.Join(root, rel), data, 0o644); err != nil {
			return err
		}
	}
	return upload(ctx, filepath.Join(work, "out.txt"), []byte("work\n"), 0o644)
}

// cpuTime is the CPU time of this process and of its children that were
// waited for (cp, for a backend that runs one).
func cpuTime() time.Duration {
	var self, children syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	d := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return d(self.Utime) + d(self.Stime) + d(children.Utime) + d(children.Stime)
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q is not a positive number", name, v)
	}
	return n
}

func bytesTrim(b []byte) string {
	s := string(b)
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}
