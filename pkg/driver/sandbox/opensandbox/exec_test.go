package opensandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// TestExecExactBytes proves the output comes back byte for byte although
// execd re-chunks it by line, drops line ends and replaces invalid UTF-8:
// printf 'a\nb\n\nc\r\nd' (execd alone gives "ab\ncd"), bytes that are
// not UTF-8, NULs, 938,895 bytes of seq, and stderr beside stdout; and
// that the exit status is the command's own (3, 137 for SIGKILL, where
// execd says -1).
func TestExecExactBytes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sb := f.create("bytes")
	res := run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", `printf 'a\nb\n\nc\r\nd'; printf '\377\376\000x\r' >&2; exit 3`}})
	if string(res.Stdout) != "a\nb\n\nc\r\nd" || string(res.Stderr) != "\xff\xfe\x00x\r" || res.ExitCode != 3 {
		t.Errorf("got exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"seq", "1", "150000"}})
	var want bytes.Buffer
	for i := 1; i <= 150000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if !bytes.Equal(res.Stdout, want.Bytes()) {
		t.Errorf("seq 1 150000: %d bytes back, want the %d exactly", len(res.Stdout), want.Len())
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo before; kill -KILL $$"}})
	if res.ExitCode != 128+9 || string(res.Stdout) != "before\n" {
		t.Errorf("a command killed by SIGKILL: exit %d stdout %q, want 137", res.ExitCode, res.Stdout)
	}
	res = run(t, sb, sandbox.ExecRequest{Argv: []string{"true"}})
	if res.ExitCode != 0 || len(res.Stdout) != 0 || len(res.Stderr) != 0 {
		t.Errorf("true: %+v", res)
	}
	// Of the execs, only the last one's report is left in the sandbox's
	// tmp, and the next exec removes it.
	last := f.lastReport(sb)
	run(t, sb, sandbox.ExecRequest{Argv: []string{"true"}})
	if next := f.lastReport(sb); next == last {
		t.Errorf("the report of %s is still there after the next exec", last)
	}
}

// lastReport checks that the sandbox's tmp holds the report of one exec
// only (its .out, .err and .x files) and returns that exec's nonce.
func (f *fixture) lastReport(sb sandbox.Sandbox) string {
	f.t.Helper()
	ents, _ := os.ReadDir(f.host(sb, "/sandbox/.ngharness/tmp"))
	var names []string
	nonce := ""
	for _, e := range ents {
		names = append(names, e.Name())
		n, _, _ := strings.Cut(strings.TrimPrefix(e.Name(), "ngx-"), ".")
		if nonce == "" {
			nonce = n
		}
		if n != nonce {
			nonce = "several"
		}
	}
	if len(names) != 3 || nonce == "several" {
		f.t.Errorf("the sandbox's tmp holds %v, want the report of the last exec only", names)
	}
	return nonce
}

// TestExecOutputCap proves output past Options.MaxOutput is an error that
// names its size (the exit code kept), not output cut short silently.
func TestExecOutputCap(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, fakeexecd.Options{}, opensandbox.Options{MaxOutput: 1000})
	sb := f.create("cap")
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"head", "-c", "2000", "/dev/zero"}})
	if err == nil || !strings.Contains(err.Error(), "stdout is 2000 bytes") || !strings.Contains(err.Error(), "MaxOutput") || res.ExitCode != 0 {
		t.Errorf("2000 bytes past a cap of 1000: exit %d, %v", res.ExitCode, err)
	}
	if res := run(t, sb, sandbox.ExecRequest{Argv: []string{"head", "-c", "1000", "/dev/zero"}}); len(res.Stdout) != 1000 {
		t.Errorf("1000 bytes at a cap of 1000: %d back", len(res.Stdout))
	}
}

// TestExecReturnsAtTheFinalEvent proves an exec returns at execd's final
// event: with execd keeping every stream open 10 minutes after it, an
// exec bounded by 60 s still succeeds.
func TestExecReturnsAtTheFinalEvent(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, fakeexecd.Options{GracefulDelay: 10 * time.Minute}, opensandbox.Options{})
	sb := f.create("final")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, argv := range [][]string{{"echo", "one"}, {"sh", "-c", "exit 4"}} {
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: argv}); err != nil {
			t.Fatalf("%q: %v", argv, err)
		}
	}
}

// TestKillBeforeTheCommandStarts proves the client's kill of an exec
// (KillScript by its nonce) holds even when it reaches the sandbox before
// the exec itself: the exec then runs nothing and says it was cancelled.
func TestKillBeforeTheCommandStarts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sb := f.create("early-kill")
	ex, err := sb.Execd(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tmp := "/sandbox/.ngharness/tmp"
	if _, err := ex.Run(ctx, opensandbox.Command{Command: opensandbox.KillScript(tmp, "feedc0de")}, nil); err != nil {
		t.Fatal(err)
	}
	res, err := ex.Run(ctx, opensandbox.Command{Command: opensandbox.Script("touch /sandbox/work/ran", time.Minute, tmp, "feedc0de", "", 1<<20)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Stdout), "x:cancelled") {
		t.Errorf("the script printed %q, want it cancelled", res.Stdout)
	}
	if _, err := os.Stat(f.host(sb, "/sandbox/work/ran")); err == nil {
		t.Errorf("the command ran although its kill came first")
	}
	if left, _ := filepath.Glob(f.host(sb, tmp+"/ngx-feedc0de*")); len(left) != 0 {
		t.Errorf("files of the cancelled exec left: %v", left)
	}
}

// TestExecStoppedCommand proves a command that is stopped is not taken for
// one that ended: one continued later comes back with its output and exit
// status, one never continued ends at its timeout.
func TestExecStoppedCommand(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sb := f.create("stopped")
	res := run(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "(sleep 0.5; kill -CONT $$) & kill -STOP $$; echo resumed; exit 5"}})
	if res.ExitCode != 5 || string(res.Stdout) != "resumed\n" {
		t.Errorf("a command stopped and continued: exit %d stdout %q", res.ExitCode, res.Stdout)
	}
	_, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sh", "-c", "kill -STOP $$"}, Timeout: 2 * time.Second})
	if !errors.Is(err, sandbox.ErrTimeout) {
		t.Errorf("a command stopped for good: %v, want ErrTimeout", err)
	}
	sandboxtest.WaitNoProcs(t, f.srv.HostPath(sb.ID()), f.srv.MountPoint())
}
