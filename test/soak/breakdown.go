package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// breakdown is where one prepare's time went, read from the driver's JSON
// log lines written while it ran: when the runs reached their pause (the
// driver's "paused" line, its time less the pause's took_ms; for a driver
// that logs no took_ms, the start of the batched command the launch was
// in), the batched `ngsup pause` commands (start, end, launches), and each
// launch's pause as ngsup timed it (elapsed_ms).
type breakdown struct {
	handler    float64   // the driver's own handler time ("checkpoint prepare" took_ms), s
	arrivals   []float64 // per launch: seconds from the prepare's start to its pause request
	commands   []float64 // per batched pause command: seconds it took
	launches   []int     // per batched pause command: launches in it
	concurrent int       // most batched pause commands running at one moment
	perLaunch  []float64 // per launch: ngsup's elapsed_ms for it, in ms
	load       string    // the 1-minute load average when the prepare answered
	// continuing counts the runs whose continue from the checkpoint before
	// returned only after this prepare began: they had to finish it before
	// they could pause again (a checkpoint that follows its predecessor's
	// resume at once).
	continuing int
}

// logLine is the part of a driver log line the breakdown reads.
type logLine struct {
	Time      time.Time `json:"time"`
	Msg       string    `json:"msg"`
	Verb      string    `json:"verb"`
	Launches  int       `json:"launches"`
	Sandbox   string    `json:"sandbox"`
	TookMS    *float64  `json:"took_ms"`
	ElapsedMS *float64  `json:"elapsed_ms"`
}

// readBreakdown reads the lines of the driver's log at path that fall in
// [begin, end] (end: when the prepare answered).
func readBreakdown(path string, begin, end time.Time) (breakdown, error) {
	var b breakdown
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) > 0 {
			b.load = f[0]
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return b, err
	}
	defer f.Close()
	type span struct{ from, to time.Time }
	var spans []span
	var noTook []time.Time // "paused" lines without took_ms: arrival from the batches
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Time.Before(begin) || l.Time.After(end.Add(time.Second)) {
			continue
		}
		switch {
		case l.Msg == "checkpoint prepare" && l.TookMS != nil:
			b.handler = *l.TookMS / 1000
		case l.Time.After(end):
		case l.Msg == "batched ngsup" && l.Verb == "pause" && l.TookMS != nil:
			took := time.Duration(*l.TookMS * float64(time.Millisecond))
			spans = append(spans, span{l.Time.Add(-took), l.Time})
			b.commands = append(b.commands, took.Seconds())
			b.launches = append(b.launches, l.Launches)
		case l.Msg == "continued":
			b.continuing++
		case l.Msg == "paused":
			if l.ElapsedMS != nil {
				b.perLaunch = append(b.perLaunch, *l.ElapsedMS)
			}
			if l.TookMS != nil {
				at := l.Time.Add(-time.Duration(*l.TookMS * float64(time.Millisecond)))
				b.arrivals = append(b.arrivals, at.Sub(begin).Seconds())
			} else {
				noTook = append(noTook, l.Time)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return b, err
	}
	if len(noTook) > 0 {
		// An older driver: each batch's launches arrived within its window
		// before the command started.
		for i, s := range spans {
			for j := 0; j < b.launches[i]; j++ {
				b.arrivals = append(b.arrivals, s.from.Sub(begin).Seconds())
			}
		}
	}
	// The most commands at once: +1 at each start, -1 at each end.
	type edge struct {
		at time.Time
		d  int
	}
	var edges []edge
	for _, s := range spans {
		edges = append(edges, edge{s.from, 1}, edge{s.to, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].d < edges[j].d
		}
		return edges[i].at.Before(edges[j].at)
	})
	n := 0
	for _, e := range edges {
		n += e.d
		b.concurrent = max(b.concurrent, n)
	}
	return b, nil
}

// median and most of xs (0 when empty).
func medMax(xs []float64) (float64, float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return m, s[len(s)-1]
}

// String is the breakdown in one line.
func (b breakdown) String() string {
	am, ax := medMax(b.arrivals)
	cm, cx := medMax(b.commands)
	pm, px := medMax(b.perLaunch)
	most := 0
	for _, n := range b.launches {
		most = max(most, n)
	}
	return fmt.Sprintf("load %s; handler %.3fs; %d runs still continuing; arrival at the pause median %.3fs max %.3fs (%d); %d pause commands (up to %d launches, %d at once) median %.3fs max %.3fs; per launch median %.1fms max %.1fms",
		b.load, b.handler, b.continuing, am, ax, len(b.arrivals), len(b.commands), most, b.concurrent, cm, cx, pm, px)
}

// printBreakdowns adds the table rows of the prepares' breakdowns: for
// each figure, its median over the checkpoints (and the largest).
func printBreakdowns(bs []breakdown) {
	if len(bs) == 0 {
		return
	}
	var handler, cont, arrMed, arrMax, cmdMed, cmdMax, perMed, perMax, cmds, conc []float64
	for _, b := range bs {
		handler = append(handler, b.handler)
		cont = append(cont, float64(b.continuing))
		m, x := medMax(b.arrivals)
		arrMed, arrMax = append(arrMed, m), append(arrMax, x)
		m, x = medMax(b.commands)
		cmdMed, cmdMax = append(cmdMed, m), append(cmdMax, x)
		m, x = medMax(b.perLaunch)
		perMed, perMax = append(perMed, m), append(perMax, x)
		cmds = append(cmds, float64(len(b.commands)))
		conc = append(conc, float64(b.concurrent))
	}
	row := func(name, format string, xs []float64) {
		m, x := medMax(xs)
		fmt.Printf("| %s (median over checkpoints; largest) | "+format+"; "+format+" |\n", name, m, x)
	}
	row("driver's prepare handler", "%.3f s", handler)
	row("runs still continuing from the checkpoint before", "%.0f", cont)
	row("runs at their pause command, median", "%.3f s", arrMed)
	row("runs at their pause command, last", "%.3f s", arrMax)
	row("batched pause commands", "%.0f", cmds)
	row("batched pause commands at once, most", "%.0f", conc)
	row("pause command, median", "%.3f s", cmdMed)
	row("pause command, longest", "%.3f s", cmdMax)
	row("one launch's pause in ngsup, median", "%.1f ms", perMed)
	row("one launch's pause in ngsup, longest", "%.1f ms", perMax)
}
