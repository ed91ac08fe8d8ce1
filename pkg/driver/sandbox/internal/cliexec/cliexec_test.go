package cliexec

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestParseMarkers proves the markers are read wherever the command's own
// output puts them: client noise before the start is the client's, a pid
// marker in the middle of a line is taken out, a fake end marker with
// another nonce is the command's output, and a missing end means the
// command never reported its end.
func TestParseMarkers(t *testing.T) {
	n := "0123456789abcdef"
	start, pid, end := "\x1engx-"+n+"-start\n", "\x1engx-"+n+"-pid 42\n", "\n\x1engx-"+n+"-end 3\n"
	o := Parse([]byte("Defaulted container\n"+start+"err"+pid+"\x1engx-0000-end 0\nmore\n"+end+"command terminated with exit code 3\n"), n)
	if !o.Started || !o.Ended || o.ExitCode != 3 || o.PID != 42 {
		t.Fatalf("outcome %+v", o)
	}
	if string(o.Stderr) != "err\x1engx-0000-end 0\nmore\n" {
		t.Errorf("stderr %q", o.Stderr)
	}
	if string(o.Client) != "Defaulted container\ncommand terminated with exit code 3\n" {
		t.Errorf("client %q", o.Client)
	}
	if o := Parse([]byte("Error: No such container: x\n"), n); o.Started || o.Ended || string(o.Client) != "Error: No such container: x\n" {
		t.Errorf("a client failure: %+v", o)
	}
	if o := Parse([]byte(start+pid+"partial"), n); !o.Started || o.Ended || o.PID != 42 || string(o.Stderr) != "partial" {
		t.Errorf("a broken connection: %+v", o)
	}
}

// TestScriptRunsUnderDashAndBash proves the script's exit codes, stdin and
// stderr under both shells a sandbox is likely to have.
func TestScriptRunsUnderDashAndBash(t *testing.T) {
	for _, shell := range []string{"/bin/sh", "/bin/bash"} {
		if _, err := exec.LookPath(shell); err != nil {
			continue
		}
		n := Nonce()
		cmd := exec.Command(shell, "-c", Script(`read x; echo "got $x"; echo oops >&2; kill -TERM $$`, 5*time.Second, n))
		cmd.Stdin = strings.NewReader("line\n")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run()
		o := Parse([]byte(stderr.String()), n)
		if !o.Ended || o.ExitCode != 143 || o.PID <= 0 || stdout.String() != "got line\n" || string(o.Stderr) != "oops\n" || len(o.Client) != 0 {
			t.Errorf("%s: outcome %+v stdout %q raw stderr %q", shell, o, stdout.String(), stderr.String())
		}
	}
}

// TestRunCancelledReportsTheContext proves that a client killed because its
// context ended is reported as the context's end every time, never as a
// client that exited on its own (which Target.run would take for a broken
// connection, and then not end the command in the sandbox). The kill and
// the client's exit race, so it is tried many times.
func TestRunCancelledReportsTheContext(t *testing.T) {
	t.Parallel()
	c := &Client{Path: "/bin/sh", Args: []string{"-c"}}
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		var res Result
		var err error
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			r, w, perr := os.Pipe()
			if perr != nil {
				err = perr
				close(started)
				return
			}
			go func() {
				buf := make([]byte, 1)
				_, _ = r.Read(buf)
				r.Close()
				close(started)
			}()
			res, err = c.Run(ctx, Call{Args: []string{"echo x; exec sleep 30"}, Stdout: w})
			w.Close()
		}()
		<-started
		cancel()
		<-finished
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("try %d: a cancelled client returned %v (exit %d), want context.Canceled", i, err, res.ExitCode)
		}
	}
}
