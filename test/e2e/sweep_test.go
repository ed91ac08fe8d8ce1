package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// TestOwnerStartSweepsTheCopyOfAKilledOwner: an `ngdriver owner serve`
// killed with SIGKILL (it and every process it started) while a commit
// snapshots a session's sandbox leaves the partial copy
// base/snapshots/.copy-ck-...; the next owner started on the same base
// removes it before it serves, and leaves the sandbox and what is not its
// own alone. The owner's cp is a wrapper that copies and then blocks, so
// the kill lands between the copy and its rename.
func TestOwnerStartSweepsTheCopyOfAKilledOwner(t *testing.T) {
	dir := t.TempDir()
	base, logs, wrap := filepath.Join(dir, "base"), filepath.Join(dir, "logs"), filepath.Join(dir, "wrap")
	for _, d := range []string{base, logs, wrap} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	realCp, err := exec.LookPath("cp")
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(wrap, "copied")
	script := "#!/bin/sh\n" + sandbox.Quote(realCp) + " \"$@\" || exit $?\n: > " + sandbox.Quote(marker) + "\nexec sleep 3600\n"
	if err := os.WriteFile(filepath.Join(wrap, "cp"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var tok [16]byte
	rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	args := []string{"owner", "serve", "--listen", "127.0.0.1:0", "--base", base, "--ngsup-dir", binDir, "--log-format", "json"}
	env := []string{"NG_CONTROL_TOKEN=" + token}

	first := e2eproc.StartProc(t, ngdriverBin, "owner0", logs, append(env, "PATH="+wrap+":"+os.Getenv("PATH")), args...)
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
	testkit.Eventually(t, "the commit's snapshot copy", func() (bool, string) {
		if _, err := os.Stat(marker); err == nil {
			return true, ""
		}
		if first.Exited() {
			t.Fatalf("the owner exited (%v) before the commit's snapshot copy was made; owner stderr:\n%s", first.State, e2eproc.Tail(first.Errs.String(), 3000))
		}
		return false, "never made; owner stderr:\n" + e2eproc.Tail(first.Errs.String(), 3000)
	})
	first.KillTree()
	<-committing
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
