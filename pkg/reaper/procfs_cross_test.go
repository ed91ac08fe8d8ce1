package reaper

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/procfs"
)

// TestParseStatMatchesPrometheusProcfs parses the stat of every live process
// with ParseStat and with github.com/prometheus/procfs, and compares the
// fields both read. Each stat is read once and the same bytes go to both
// parsers (procfs reads them from a copy under a temp folder), so a process
// that changes state between two reads cannot make the test flaky. A few
// processes with hostile command names are started first, so the comparison
// covers them too.
func TestParseStatMatchesPrometheusProcfs(t *testing.T) {
	for _, name := range []string{"a) (b", "sp ace", "nl\nnl", strings.Repeat(")", 15), "((x"} {
		startSleeper(t, name)
	}
	snap := t.TempDir()
	pids, err := ProcFS.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	raw := map[int][]byte{}
	for _, pid := range pids {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue // exited since the listing
		}
		dir := filepath.Join(snap, strconv.Itoa(pid))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		raw[pid] = data
	}
	if len(raw) < 5 {
		t.Fatalf("read only %d stat files", len(raw))
	}
	pfs, err := procfs.NewFS(snap)
	if err != nil {
		t.Fatal(err)
	}
	nasty := 0
	for pid, data := range raw {
		ours, err := ParseStat(data)
		if err != nil {
			t.Errorf("ParseStat(%q): %v", data, err)
			continue
		}
		p, err := pfs.Proc(pid)
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := p.Stat()
		if err != nil {
			t.Errorf("procfs on %q: %v", data, err)
			continue
		}
		var errs []error
		check := func(field string, a, b any) {
			if a != b {
				errs = append(errs, errors.New(field+": ours "+strconv.Quote(toString(a))+", procfs "+strconv.Quote(toString(b))))
			}
		}
		check("pid", ours.PID, theirs.PID)
		check("comm", ours.Comm, theirs.Comm)
		check("state", string(ours.State), theirs.State)
		check("ppid", ours.PPID, theirs.PPID)
		check("pgrp", ours.PGID, theirs.PGRP)
		check("session", ours.SID, theirs.Session)
		check("num_threads", ours.NumThreads, theirs.NumThreads)
		check("starttime", ours.StartTicks, theirs.Starttime)
		check("utime", ours.UTime, uint64(theirs.UTime))
		check("stime", ours.STime, uint64(theirs.STime))
		if len(errs) > 0 {
			t.Errorf("pid %d, stat %q: %v", pid, data, errors.Join(errs...))
		}
		if strings.ContainsAny(ours.Comm, "()\n ") {
			nasty++
		}
	}
	if nasty < 5 {
		t.Errorf("only %d processes with parentheses, spaces or newlines in their names were compared", nasty)
	}
	t.Logf("compared %d processes (%d with hostile names)", len(raw), nasty)
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int:
		return strconv.Itoa(x)
	case uint64:
		return strconv.FormatUint(x, 10)
	}
	return "?"
}
