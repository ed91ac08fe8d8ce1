package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/e2eproc"
)

// TestOwnerStartSweepsTheCopyOfAKilledOwner: an `ngdriver owner serve`
// killed with SIGKILL (it and every process it started) while a commit
// snapshots a session's sandbox leaves the partial copy
// base/snapshots/.copy-ck-...; the next owner started on the same base
// removes it before it serves, and leaves the sandbox and what is not its
// own alone. The test holds a write lease on a file of the sandbox, so
// the copy blocks when it opens that file (the lease's break is signalled
// to the test: the copy is then in progress) and the kill lands in the
// middle of the copy.
func TestOwnerStartSweepsTheCopyOfAKilledOwner(t *testing.T) {
	dir := t.TempDir()
	base, logs := filepath.Join(dir, "base"), filepath.Join(dir, "logs")
	for _, d := range []string{base, logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var tok [16]byte
	rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	args := []string{"owner", "serve", "--listen", "127.0.0.1:0", "--base", base, "--ngsup-dir", binDir, "--log-format", "json"}
	env := []string{"NG_CONTROL_TOKEN=" + token}

	first := e2eproc.StartProc(t, ngdriverBin, "owner0", logs, env, args...)
	t.Cleanup(first.KillTree)
	own := &controller{name: "owner", url: first.URL(t), token: token}
	seed, err := json.Marshal(map[string]any{"files": map[string]string{"a.txt": "one"}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(own.url+"/ng-rollout/"+runTag+"-sweep/seed_session", "application/json", bytes.NewReader(seed))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("seed: HTTP %d", resp.StatusCode)
	}
	sandboxes, _ := filepath.Glob(filepath.Join(base, "sandboxes", "sb-*"))
	if len(sandboxes) != 1 {
		t.Fatalf("sandboxes after the seed: %v", sandboxes)
	}
	// The lease: its break (the copy opening the file) is signalled here.
	held, err := unix.Open(filepath.Join(sandboxes[0], "work", "a.txt"), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(held)
	broken := make(chan os.Signal, 1)
	signal.Notify(broken, syscall.SIGIO)
	defer signal.Stop(broken)
	if _, err := unix.FcntlInt(uintptr(held), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		t.Skipf("no write lease on the sandbox's file here: %v", err)
	}
	release := func() { unix.FcntlInt(uintptr(held), unix.F_SETLEASE, unix.F_UNLCK) }
	defer release()
	id := runTag + "-sweep-ck1"
	var prep prepared
	own.must(t, "prepare", plainBody(id), &prep)
	commitBody, err := json.Marshal(commitBody(id, filepath.Join(dir, "ck1"), nil, false))
	if err != nil {
		t.Fatal(err)
	}
	committing := make(chan struct{})
	go func() {
		defer close(committing)
		req, _ := http.NewRequest(http.MethodPost, own.url+"/ng-control/v1/checkpoint/commit", bytes.NewReader(commitBody))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-broken:
	case <-committing:
		t.Fatalf("the commit ended without opening the leased file; owner stderr:\n%s", e2eproc.Tail(first.Errs.String(), 3000))
	case <-time.After(waitLimit):
		t.Fatalf("the commit's snapshot copy never opened the leased file; owner stderr:\n%s", e2eproc.Tail(first.Errs.String(), 3000))
	}
	first.KillTree()
	<-committing
	release()
	left, _ := filepath.Glob(filepath.Join(base, "snapshots", ".copy-ck-*"))
	if len(left) != 1 {
		t.Fatalf("the killed owner left %v, want one partial copy", left)
	}
	// Not the owner's to sweep: a name of another shape.
	decoy := filepath.Join(base, "snapshots", ".copy-not-a-temporary")
	if err := os.MkdirAll(decoy, 0o755); err != nil {
		t.Fatal(err)
	}

	second := e2eproc.StartProc(t, ngdriverBin, "owner1", logs, env, args...)
	t.Cleanup(second.KillTree)
	second.URL(t)
	if left, _ := filepath.Glob(filepath.Join(base, "snapshots", ".copy-ck-*")); len(left) != 0 {
		t.Errorf("the partial copy is still there after a new owner started: %v", left)
	}
	for _, p := range append(sandboxes, decoy) {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the new owner's start removed %s: %v", p, err)
		}
	}
	for _, p := range []*e2eproc.Proc{first, second} {
		if lines := e2eproc.ErrorsIn(p.Errs.String()); len(lines) > 0 {
			t.Errorf("%s reported: %v", p.Name, lines)
		}
	}
}
