package reaper

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Tree lists the processes of the launch in dir (the supervisor first when
// it is alive), touching none of them. What it does in each state is the
// transition table's (transitions.go).
func Tree(dir string) (proto.TreeResult, error) {
	l, st, _, _, err := openFor(VerbTree, dir, "", false)
	if err != nil {
		return proto.TreeResult{}, err
	}
	if Transition(VerbTree, st).Do == Refuse {
		return proto.TreeResult{}, refuse(VerbTree, st, l.noReceipt())
	}
	f := newFinder(l)
	found := f.pass(nil)
	res := proto.TreeResult{ID: l.Receipt.ID, Supervised: l.Supervised}
	if l.Supervised {
		if st, err := l.FS.ReadStat(l.Receipt.SupervisorPID); err == nil {
			found[st.PID] = st
			res.Root = st.PID
		}
	}
	res.Processes = l.FS.ordered(found)
	return res, nil
}

// TreeFromPID lists pid and all its descendants.
func TreeFromPID(pid int) (proto.TreeResult, error) {
	fs := ProcFS
	root, err := fs.ReadStat(pid)
	if err != nil {
		return proto.TreeResult{}, fmt.Errorf("read process %d: %w", pid, err)
	}
	found := map[int]Stat{pid: root}
	queue := []Stat{root}
	var kids []int
	for len(queue) > 0 {
		st := queue[0]
		queue = queue[1:]
		threads := st.NumThreads
		if st.State == 'Z' {
			threads = 0
		}
		kids, _ = fs.Children(st.PID, threads, kids[:0])
		for _, k := range kids {
			if _, ok := found[k]; ok {
				continue
			}
			kst, err := fs.ReadStat(k)
			if err != nil || kst.PPID != st.PID {
				continue
			}
			found[k] = kst
			queue = append(queue, kst)
		}
	}
	return proto.TreeResult{Root: pid, Processes: fs.ordered(found)}, nil
}

// ordered returns the processes parents first, children by pid, depth-first.
func (fs FS) ordered(found map[int]Stat) []proto.TreeProc {
	children := map[int][]int{}
	var roots []int
	for pid, st := range found {
		if _, ok := found[st.PPID]; ok && st.PPID != pid {
			children[st.PPID] = append(children[st.PPID], pid)
		} else {
			roots = append(roots, pid)
		}
	}
	slices.Sort(roots)
	out := make([]proto.TreeProc, 0, len(found))
	var visit func(pid int)
	visit = func(pid int) {
		st := found[pid]
		out = append(out, proto.TreeProc{
			PID: pid, PPID: st.PPID, PGID: st.PGID, SID: st.SID,
			State: string(st.State), StartTicks: st.StartTicks, Threads: st.NumThreads,
			Comm: st.Comm, Cmdline: fs.Cmdline(pid),
		})
		kids := children[pid]
		slices.Sort(kids)
		for _, k := range kids {
			visit(k)
		}
	}
	for _, r := range roots {
		visit(r)
	}
	return out
}

// RenderTree writes a tree for a person: a header line, then one row per
// process with its place in the tree drawn before the command.
func RenderTree(w io.Writer, t proto.TreeResult) error {
	if t.ID != "" {
		sup := "gone"
		if t.Supervised {
			sup = fmt.Sprintf("pid %d", t.Root)
		}
		fmt.Fprintf(w, "launch %s  supervisor %s  processes %d\n", t.ID, sup, len(t.Processes))
	}
	byPID := map[int]proto.TreeProc{}
	kids := map[int][]int{}
	for _, p := range t.Processes {
		byPID[p.PID] = p
	}
	for _, p := range t.Processes {
		if _, ok := byPID[p.PPID]; ok {
			kids[p.PPID] = append(kids[p.PPID], p.PID)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tPPID\tPGID\tSID\tSTATE\tSTART\tCOMMAND")
	// prefix[pid] is the drawing before pid's command.
	prefix := map[int]string{}
	for _, p := range t.Processes {
		pre, isChild := prefix[p.PID]
		cmd := p.Cmdline
		if cmd == "" {
			cmd = "[" + p.Comm + "]"
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%d\t%s%s\n", p.PID, p.PPID, p.PGID, p.SID, p.State, p.StartTicks, pre, oneLine(cmd, 160))
		list := kids[p.PID]
		base := ""
		if isChild {
			base = strings.TrimSuffix(strings.TrimSuffix(pre, "├─ "), "└─ ")
			if strings.HasSuffix(pre, "├─ ") {
				base += "│  "
			} else {
				base += "   "
			}
		}
		for i, k := range list {
			if i == len(list)-1 {
				prefix[k] = base + "└─ "
			} else {
				prefix[k] = base + "├─ "
			}
		}
	}
	return tw.Flush()
}

// oneLine keeps a command on one row: control characters become spaces and
// long commands are cut.
func oneLine(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}
