package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestTree proves that `ngsup tree` shows every process of the launch: the
// readable output has a row with the pid and command of each, `--json` is one
// line that parses into proto.TreeResult and agrees with /proc, and `--pid`
// shows a process and its descendants.
func TestTree(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg", "-setsid", "-daemon", "-noenv"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid", "daemon", "noenv"} {
		procs[role] = l.role(role)
	}
	daemon := procs["daemon"]
	testkit.Eventually(t, "the daemon to be adopted by the supervisor", func() (bool, string) {
		st, _ := readStat(daemon.PID)
		return st.PPID == l.Sup.PID, "ppid " + itoa(st.PPID)
	})
	procs["supervisor"] = proc{l.Sup.PID, l.Sup.StartTicks}

	t.Run("readable", func(t *testing.T) {
		r := l.verb("tree")
		wantCode(t, r, 0)
		lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
		if len(lines) < 2 || !strings.Contains(lines[0], l.ID) {
			t.Fatalf("no header naming the launch:\n%s", r.stdout)
		}
		rows := map[int]string{}
		for _, line := range lines[1:] {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if pid, err := strconv.Atoi(f[0]); err == nil {
				rows[pid] = line
			}
		}
		wantCmd := map[string]string{
			"harness": testBin, "daemon": testBin, "bg": "sleep 1000", "setsid": "sleep 1000",
			"noenv": "sleep 1000", "supervisor": "ngsup run",
		}
		for _, name := range sortedKeys(procs) {
			row, ok := rows[procs[name].PID]
			if !ok {
				t.Errorf("no row for %s (pid %d):\n%s", name, procs[name].PID, r.stdout)
				continue
			}
			if !strings.Contains(row, wantCmd[name]) {
				t.Errorf("the row of %s does not show %q: %s", name, wantCmd[name], row)
			}
		}
	})

	t.Run("json", func(t *testing.T) {
		r := l.verb("tree", "--json")
		wantCode(t, r, 0)
		var tr proto.TreeResult
		r.json(t, &tr)
		if tr.ID != l.ID || tr.Root != l.Sup.PID || !tr.Supervised {
			t.Errorf("tree: id %q root %d supervised %v, want %q %d true", tr.ID, tr.Root, tr.Supervised, l.ID, l.Sup.PID)
		}
		wantTree(t, tr, procs)
	})

	t.Run("pid", func(t *testing.T) {
		h := procs["harness"]
		r := ngsup(t, "tree", "--pid", itoa(h.PID), "--json")
		wantCode(t, r, 0)
		var tr proto.TreeResult
		r.json(t, &tr)
		if tr.Root != h.PID {
			t.Errorf("tree --pid %d: root %d", h.PID, tr.Root)
		}
		sub := map[string]proc{}
		for _, name := range []string{"harness", "bg", "setsid", "noenv"} {
			sub[name] = procs[name]
		}
		wantTree(t, tr, sub)
		for _, p := range tr.Processes {
			if p.PID == l.Sup.PID || p.PID == daemon.PID {
				t.Errorf("tree --pid %d lists %d, which is not its descendant", h.PID, p.PID)
			}
		}
		r = ngsup(t, "tree", "--pid", itoa(h.PID))
		wantCode(t, r, 0)
		if !strings.Contains(r.stdout, itoa(procs["bg"].PID)) || !strings.Contains(r.stdout, "sleep 1000") {
			t.Errorf("readable tree --pid does not show the harness's children:\n%s", r.stdout)
		}
	})
}

// wantTree checks that tr lists every process in procs with what /proc says
// of it.
func wantTree(t *testing.T, tr proto.TreeResult, procs map[string]proc) {
	t.Helper()
	byPID := map[int]proto.TreeProc{}
	for _, p := range tr.Processes {
		if _, dup := byPID[p.PID]; dup {
			t.Errorf("pid %d listed twice", p.PID)
		}
		byPID[p.PID] = p
	}
	for _, name := range sortedKeys(procs) {
		want := procs[name]
		got, ok := byPID[want.PID]
		if !ok {
			t.Errorf("tree does not list %s (pid %d): %+v", name, want.PID, tr.Processes)
			continue
		}
		st, err := readStat(want.PID)
		if err != nil {
			t.Fatal(err)
		}
		if got.StartTicks != want.Start || got.PPID != st.PPID || got.PGID != st.PGID || got.SID != st.SID || got.State == "" || got.Cmdline == "" {
			t.Errorf("tree's %s: %+v; /proc says ppid %d pgid %d sid %d start %d", name, got, st.PPID, st.PGID, st.SID, want.Start)
		}
	}
}
