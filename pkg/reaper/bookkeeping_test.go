package reaper

import (
	"os"
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
	procs, skipped := readProcSet(path)
	want := []proto.Proc{{PID: 10, StartTicks: 20}, {PID: 30, StartTicks: 40}}
	if !slices.Equal(procs, want) || skipped != 2 {
		t.Errorf("readProcSet: %v skipped %d, want %v skipped 2", procs, skipped, want)
	}
	if procs, skipped := readProcSet(t.TempDir()); procs != nil || skipped != 1 {
		t.Errorf("readProcSet of a folder: %v skipped %d, want nothing skipped 1", procs, skipped)
	}
}
