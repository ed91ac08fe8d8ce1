package harnesstest

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// WriteHold holds back every open of one file for writing, by any process:
// the test holds a read lease on it (fcntl F_SETLEASE F_RDLCK), so the
// kernel makes a writer's open wait until the lease goes (Release, or the
// lease-break-time of /proc/sys/fs/lease-break-time, 45 s by default, after
// the first such open). A harness that appends to the file from a worker
// thread (Claude Code's session) goes on with everything else while its
// write waits: a slow disk or a loaded machine made deterministic. Reads
// are never held.
type WriteHold struct {
	f    *os.File
	path string
}

// HoldWrites takes a write hold on path (retrying while a writer has the
// file open: a lease needs no open writer) and releases it in the test's
// cleanup if the test has not.
func (w *World) HoldWrites(path string) *WriteHold {
	w.T.Helper()
	h := &WriteHold{path: path}
	w.Eventually("a read lease on "+path, func() (bool, string) {
		f, err := os.Open(path)
		if err != nil {
			return false, err.Error()
		}
		if _, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_RDLCK); err != nil {
			f.Close()
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY) {
				return false, "a writer has the file open"
			}
			w.T.Fatalf("cannot take a read lease on %s: %v", path, err)
		}
		h.f = f
		return true, ""
	})
	w.T.Cleanup(h.Release)
	return h
}

// Waiting tells that a writer's open is waiting on the hold (the kernel
// is breaking the lease), or that the lease is gone.
func (h *WriteHold) Waiting() bool {
	if h.f == nil {
		return false
	}
	t, err := unix.FcntlInt(h.f.Fd(), unix.F_GETLEASE, 0)
	return err != nil || t != unix.F_RDLCK
}

// Release lets the waiting writers through. It may be called more than
// once.
func (h *WriteHold) Release() {
	if h.f != nil {
		h.f.Close()
		h.f = nil
	}
}

// String names the held file.
func (h *WriteHold) String() string { return fmt.Sprintf("the write hold on %s", h.path) }
