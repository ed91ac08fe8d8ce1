package reaper

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// FuzzParseStat: ParseStat never panics, and what it accepts is consistent
// with the text: the command name is exactly what lies between the first
// '(' and the last ')', and a stat line rebuilt from the result parses to the
// same result. Run: go test -run '^$' -fuzz FuzzParseStat ./pkg/reaper/
func FuzzParseStat(f *testing.F) {
	for _, comm := range []string{"sleep", "a) (b", "", strings.Repeat(")", 15), "new\nline", "(", " "} {
		line := statLine(sampleStat(comm))
		f.Add([]byte(line))
		f.Add([]byte(line[:len(line)/2]))
	}
	f.Add([]byte("1 (systemd) S 0 1 1 0 -1 4194560 12345 1234567 89 1234 100 200 3000 4000 20 0 1 0 2 170000000 3000 18446744073709551615 1 1 0 0 0 0 671173123 4096 1260 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"))
	f.Add([]byte(""))
	f.Add([]byte("garbage"))
	f.Add([]byte("12 (x) S"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseStat(data)
		if err != nil {
			return
		}
		open := bytes.IndexByte(data, '(')
		closeIdx := bytes.LastIndexByte(data, ')')
		if open < 0 || closeIdx < open || st.Comm != string(data[open+1:closeIdx]) {
			t.Fatalf("ParseStat(%q) took comm %q", data, st.Comm)
		}
		if st.State == ' ' || st.State == '\n' {
			t.Fatalf("ParseStat(%q) took state %q", data, st.State)
		}
		again, err := ParseStat([]byte(statLine(st)))
		if err != nil {
			t.Fatalf("a line rebuilt from %+v does not parse: %v", st, err)
		}
		if again != st {
			t.Fatalf("ParseStat(%q) = %+v, but the rebuilt line gives %+v", data, st, again)
		}
	})
}

// BenchmarkParseStat measures parsing one stat line (no /proc read).
func BenchmarkParseStat(b *testing.B) {
	line := []byte(statLine(sampleStat("sleep")))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseStat(line); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadStat measures reading and parsing this process's own stat.
func BenchmarkReadStat(b *testing.B) {
	pid := os.Getpid()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ProcFS.ReadStat(pid); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChildren measures listing this process's children (every thread).
func BenchmarkChildren(b *testing.B) {
	pid := os.Getpid()
	st, err := ProcFS.ReadStat(pid)
	if err != nil {
		b.Fatal(err)
	}
	var kids []int
	b.ReportAllocs()
	for b.Loop() {
		kids, _ = ProcFS.Children(pid, st.NumThreads, kids[:0])
	}
}
