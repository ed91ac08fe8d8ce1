package reaper

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ngharness/ngharness/pkg/proto"
)

// TestReadProcSetCap proves that a bookkeeping file over the cap is read
// from its last maxProcSetBytes: the records there are kept, and the part
// before (a hole of zero bytes here) counts as one skipped line.
func TestReadProcSetCap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "known")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tail := []byte("\n10 20\nnot a record\n30 40\n")
	if _, err := f.WriteAt(tail, maxProcSetBytes+4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	procs, _, skipped := readProcSet(path)
	want := []proto.Proc{{PID: 10, StartTicks: 20}, {PID: 30, StartTicks: 40}}
	if !slices.Equal(procs, want) || skipped != 2 {
		t.Errorf("readProcSet: %v skipped %d, want %v skipped 2", procs, skipped, want)
	}
	if procs, _, skipped := readProcSet(t.TempDir()); procs != nil || skipped != 1 {
		t.Errorf("readProcSet of a folder: %v skipped %d, want nothing skipped 1", procs, skipped)
	}
}

// TestProcSetInodes proves that the known and paused sets carry the pidfs
// inode as an optional third field: written for a live process where the
// kernel has pidfs, read back with it, and old two-field lines still read.
func TestProcSetInodes(t *testing.T) {
	self, err := ProcFS.Identify(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !havePidfs() {
		t.Skip("no pidfs here (Linux before 6.9): the sets carry two fields")
	}
	ino := ProcFS.Inode(self)
	if ino == 0 || ProcFS.Inode(self) != ino {
		t.Fatalf("Inode of this process: %d, then %d, want the same non-zero value", ino, ProcFS.Inode(self))
	}
	child := exec.Command("/bin/sleep", "100")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	cp, err := ProcFS.Identify(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if c := ProcFS.Inode(cp); c == 0 || c == ino {
		t.Errorf("Inode of a child: %d, this process: %d; want two different non-zero values", c, ino)
	}
	old := proto.Proc{PID: 4242, StartTicks: 77}
	path := filepath.Join(t.TempDir(), "known")
	data := append(formatProcSet([]proto.Proc{self}, ProcFS.Inode), "4242 77\n"...)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	procs, inodes, skipped := readProcSet(path)
	if !slices.Equal(procs, []proto.Proc{self, old}) || inodes[self] != ino || inodes[old] != 0 || skipped != 0 {
		t.Errorf("read back %v %v skipped %d from %q", procs, inodes, skipped, data)
	}
}

// TestParseProcLine pins what a record line of the known and paused sets
// is: two or three fields of digits split by white space, a positive pid.
func TestParseProcLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		p    proto.Proc
		ino  uint64
		ok   bool
	}{
		{"10 20", proto.Proc{PID: 10, StartTicks: 20}, 0, true},
		{"10 20 30", proto.Proc{PID: 10, StartTicks: 20}, 30, true},
		{" 10\t20  30 ", proto.Proc{PID: 10, StartTicks: 20}, 30, true},
		{"10", proto.Proc{}, 0, false},
		{"10 20 30 40", proto.Proc{}, 0, false},
		{"0 20", proto.Proc{}, 0, false},
		{"-1 20", proto.Proc{}, 0, false},
		{"x 20", proto.Proc{}, 0, false},
		{"10 -20", proto.Proc{}, 0, false},
		{"10 20 x", proto.Proc{}, 0, false},
		{"", proto.Proc{}, 0, false},
	} {
		p, ino, ok := parseProcLine([]byte(tc.line))
		if p != tc.p || ino != tc.ino || ok != tc.ok {
			t.Errorf("parseProcLine(%q) = %v %d %v, want %v %d %v", tc.line, p, ino, ok, tc.p, tc.ino, tc.ok)
		}
	}
}
