package reaper

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// statLine builds a /proc/PID/stat line as the kernel writes it (52 fields,
// a newline at the end) with the fields ngsup reads set.
func statLine(st Stat) string {
	f := make([]string, 52)
	for i := range f {
		f[i] = "0"
	}
	f[0] = strconv.Itoa(st.PID)
	f[1] = "(" + st.Comm + ")"
	f[2] = string([]byte{st.State})
	f[3] = strconv.Itoa(st.PPID)
	f[4] = strconv.Itoa(st.PGID)
	f[5] = strconv.Itoa(st.SID)
	f[6] = "34816" // tty
	f[7] = "-1"    // tpgid
	f[13] = strconv.FormatUint(st.UTime, 10)
	f[14] = strconv.FormatUint(st.STime, 10)
	f[17] = "20" // priority
	f[18] = "-5" // nice
	f[19] = strconv.Itoa(st.NumThreads)
	f[21] = strconv.FormatUint(st.StartTicks, 10)
	f[22] = "18446744073709551615" // vsize: a big number after the last field read
	return strings.Join(f, " ") + "\n"
}

func sampleStat(comm string) Stat {
	return Stat{PID: 4321, Comm: comm, State: 'S', PPID: 4000, PGID: 4001, SID: 4002,
		UTime: 17, STime: 23, NumThreads: 3, StartTicks: 987654321}
}

func TestParseStatNastyNames(t *testing.T) {
	for _, comm := range []string{
		"sleep",
		"with space",
		"a) (b",
		") S 1 2 3 4 5",
		"(",
		")",
		"((",
		"x)",
		"(x",
		"new\nline",
		"\n",
		"",
		" ",
		strings.Repeat(")", 15),
		strings.Repeat("(", 15),
		"tab\there",
		"kworker/0:1-ev",
		"\x00nul",
		"ü",
	} {
		t.Run(fmt.Sprintf("%q", comm), func(t *testing.T) {
			want := sampleStat(comm)
			got, err := ParseStat([]byte(statLine(want)))
			if err != nil {
				t.Fatalf("ParseStat: %v", err)
			}
			if got != want {
				t.Fatalf("ParseStat:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestParseStatStates(t *testing.T) {
	for _, s := range "RSDZTtXxKWIP" {
		want := sampleStat("x")
		want.State = byte(s)
		got, err := ParseStat([]byte(statLine(want)))
		if err != nil || got != want {
			t.Errorf("state %c: got %+v, %v", s, got, err)
		}
	}
}

func TestParseStatNoTrailingNewline(t *testing.T) {
	// A stat cut right after field 22, with or without a newline.
	want := sampleStat("cut")
	fields := strings.Fields(statLine(want))
	for _, tail := range []string{"", "\n"} {
		got, err := ParseStat([]byte(strings.Join(fields[:22], " ") + tail))
		if err != nil || got != want {
			t.Errorf("22 fields + %q: got %+v, %v", tail, got, err)
		}
	}
}

func TestParseStatMaxValues(t *testing.T) {
	want := sampleStat("max")
	want.StartTicks = 1<<64 - 1
	want.UTime = 1<<64 - 1
	want.PID = 1<<22 - 1 // pid_max's ceiling
	got, err := ParseStat([]byte(statLine(want)))
	if err != nil || got != want {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestParseStatErrors(t *testing.T) {
	good := statLine(sampleStat("ok"))
	fields := strings.Fields(good)
	withField := func(i int, v string) string {
		f := slices.Clone(fields)
		f[i] = v
		return strings.Join(f, " ")
	}
	for _, tc := range []struct {
		name, line, says string
	}{
		{"empty", "", "no command name"},
		{"newline", "\n", "no command name"},
		{"pid only", "123", "no command name"},
		{"unclosed name", "123 (sleep S 1 2 3", "no command name"},
		{"no open paren", "123 sleep) S 1", "no command name"},
		{"name first", "(sleep) S 1 2 3", "no command name"},
		{"close before open", "123 )x( S 1", "no command name"},
		{"bad pid", "12a (x) S 1 2 3", "bad pid"},
		{"no pid", " (x) S 1 2 3", "bad pid"},
		{"name only", "123 (x)", "only 2 fields"},
		{"state only", "123 (x) S", "only 3 fields"},
		{"cut at field 21", strings.Join(fields[:21], " "), "only 21 fields"},
		{"cut at field 21 with newline", strings.Join(fields[:21], " ") + "\n", "only 21 fields"},
		{"ppid not a number", withField(3, "one"), "field 4"},
		{"pgid not a number", withField(4, "0x10"), "field 5"},
		{"sid not a number", withField(5, "-"), "field 6"},
		{"utime negative", withField(13, "-1"), "field 14"},
		{"stime not a number", withField(14, "1e3"), "field 15"},
		{"threads not a number", withField(19, "many"), "field 20"},
		{"start time not a number", withField(21, "soon"), "field 22"},
		{"start time overflows", withField(21, "18446744073709551616"), "field 22"},
		{"start time negative", withField(21, "-5"), "field 22"},
		{"garbage", "\x00\x01\x02 garbage ((((", "no command name"},
		{"binary", string([]byte{0xff, 0xfe, '(', ')', 0xff}), "bad pid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := ParseStat([]byte(tc.line))
			if err == nil {
				t.Fatalf("ParseStat(%q) accepted: %+v", tc.line, st)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("ParseStat(%q) = %q, does not say %q", tc.line, err, tc.says)
			}
		})
	}
}

func TestParseStatEveryPrefix(t *testing.T) {
	// Every cut of a real-looking line either fails or parses the fields it
	// needs, never panics, and never reports a start time it did not read.
	want := sampleStat("a) (b")
	line := statLine(want)
	full := strings.Index(line, " "+strconv.FormatUint(want.StartTicks, 10)+" ") + 1 + len(strconv.FormatUint(want.StartTicks, 10))
	for n := 0; n <= len(line); n++ {
		got, err := ParseStat([]byte(line[:n]))
		switch {
		case n >= full && (err != nil || got != want):
			t.Fatalf("cut at %d (after the start time): got %+v, %v", n, got, err)
		case n < full && err == nil && got.StartTicks == want.StartTicks:
			t.Fatalf("cut at %d (before the start time's end) claimed the whole start time", n)
		}
	}
}

func TestParsePending(t *testing.T) {
	status := func(shd, sig string) string {
		return "Name:\tsleep\nUmask:\t0022\nState:\tT (stopped)\nTgid:\t10\nPid:\t10\n" +
			"SigQ:\t1/95000\nSigPnd:\t" + sig + "\nShdPnd:\t" + shd + "\nSigBlk:\t0000000000000000\n" +
			"SigIgn:\t0000000000000000\nSigCgt:\t0000000000000000\nCapInh:\t0000000000000000\n"
	}
	for _, tc := range []struct {
		shd, sig         string
		wantShd, wantSig uint64
		stop             bool
	}{
		{"0000000000000000", "0000000000000000", 0, 0, false},
		{"0000000000040000", "0000000000000000", SigStop, 0, true},
		{"0000000000000000", "0000000000040000", 0, SigStop, true},
		{"0000000000000002", "0000000000000100", 2, 0x100, false}, // SIGINT, SIGKILL
		{"ffffffffffffffff", "8000000000000001", 1<<64 - 1, 1<<63 | 1, true},
		{"40000", "0", SigStop, 0, true}, // short hex
	} {
		shd, sig, err := ParsePending([]byte(status(tc.shd, tc.sig)))
		if err != nil {
			t.Fatalf("%s/%s: %v", tc.shd, tc.sig, err)
		}
		if shd != tc.wantShd || sig != tc.wantSig {
			t.Errorf("%s/%s: got %#x/%#x, want %#x/%#x", tc.shd, tc.sig, shd, sig, tc.wantShd, tc.wantSig)
		}
		if got := (shd|sig)&SigStop != 0; got != tc.stop {
			t.Errorf("%s/%s: SIGSTOP pending %v, want %v", tc.shd, tc.sig, got, tc.stop)
		}
	}
	if SigStop != 0x40000 {
		t.Fatalf("SigStop = %#x, want 0x40000 (signal 19)", SigStop)
	}
	// The last line without a newline.
	shd, sig, err := ParsePending([]byte("SigPnd:\t0000000000000001\nShdPnd:\t0000000000040000"))
	if err != nil || shd != SigStop || sig != 1 {
		t.Fatalf("no trailing newline: %#x %#x %v", shd, sig, err)
	}
	for _, tc := range []struct{ name, text, says string }{
		{"empty", "", "no ShdPnd/SigPnd"},
		{"no lines", "Name:\tx\nState:\tS\n", "no ShdPnd/SigPnd"},
		{"ShdPnd missing", "SigPnd:\t0000000000000000\n", "no ShdPnd/SigPnd"},
		{"SigPnd missing", "ShdPnd:\t0000000000000000\n", "no ShdPnd/SigPnd"},
		{"a look-alike key", "XShdPnd:\t0\nSigPnd:\t0\n", "no ShdPnd/SigPnd"},
		{"bad hex", "SigPnd:\t00000000000000zz\nShdPnd:\t0\n", "SigPnd"},
		{"empty value", "SigPnd:\t0\nShdPnd:\t\n", "ShdPnd"},
		{"too long", "SigPnd:\t0\nShdPnd:\t10000000000000000\n", "ShdPnd"},
		{"garbage", "\x00\xff:::\n\n", "no ShdPnd/SigPnd"},
	} {
		_, _, err := ParsePending([]byte(tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.says)
		}
	}
}

func TestEnvironHas(t *testing.T) {
	const tag = "NEMO_GYM_HARNESS_LAUNCH"
	env := func(entries ...string) []byte { return []byte(strings.Join(entries, "\x00") + "\x00") }
	for _, tc := range []struct {
		name    string
		environ []byte
		entry   string
		want    bool
	}{
		{"exact", env("PATH=/bin", tag+"=a", "HOME=/"), tag + "=a", true},
		{"a is not ab", env("PATH=/bin", tag+"=ab"), tag + "=a", false},
		{"ab is not a", env(tag + "=a"), tag + "=ab", false},
		{"no prefix match", env("X" + tag + "=a"), tag + "=a", false},
		{"first", env(tag+"=a", "B=1"), tag + "=a", true},
		{"last with a trailing NUL", env("B=1", tag+"=a"), tag + "=a", true},
		{"last without a trailing NUL", []byte("B=1\x00" + tag + "=a"), tag + "=a", true},
		{"only entry, no NUL", []byte(tag + "=a"), tag + "=a", true},
		{"cut short at the end", []byte("B=1\x00" + tag + "="), tag + "=a", false},
		{"across a NUL", []byte(tag + "=\x00a\x00"), tag + "=a", false},
		{"across a NUL, split key", []byte("NEMO_GYM\x00_HARNESS_LAUNCH=a\x00"), tag + "=a", false},
		{"value with a suffix", env(tag + "=a\nb"), tag + "=a", false},
		{"empty environ", nil, tag + "=a", false},
		{"only NULs", []byte("\x00\x00\x00"), tag + "=a", false},
		{"empty entries around", []byte("\x00\x00" + tag + "=a\x00\x00"), tag + "=a", true},
		{"second of two tags", env(tag+"=outer", tag+"=a"), tag + "=a", true},
		{"key only", env(tag), tag + "=a", false},
	} {
		if got := EnvironHas(tc.environ, tc.entry); got != tc.want {
			t.Errorf("%s: EnvironHas(%q, %q) = %v, want %v", tc.name, tc.environ, tc.entry, got, tc.want)
		}
	}
}

// fakeProc is a /proc tree under a temp folder.
type fakeProc struct {
	t    *testing.T
	root string
}

func newFakeProc(t *testing.T) *fakeProc {
	return &fakeProc{t: t, root: t.TempDir()}
}

func (p *fakeProc) fs() FS { return FS{Root: p.root} }

func (p *fakeProc) write(rel, content string) {
	p.t.Helper()
	path := filepath.Join(p.root, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// task adds a thread of pid with the children it forked.
func (p *fakeProc) task(pid, tid int, children ...int) {
	var b strings.Builder
	for _, c := range children {
		fmt.Fprintf(&b, "%d ", c) // the kernel's format: each pid and a space
	}
	p.write(fmt.Sprintf("%d/task/%d/children", pid, tid), b.String())
	st := sampleStat("t")
	st.PID = tid
	p.write(fmt.Sprintf("%d/task/%d/stat", pid, tid), statLine(st))
}

func sorted(v []int) []int {
	v = slices.Clone(v)
	slices.Sort(v)
	return v
}

func TestChildrenEveryThread(t *testing.T) {
	p := newFakeProc(t)
	p.task(100, 100, 101, 102)
	p.task(100, 105, 103)       // forked by a second thread
	p.task(100, 106)            // a thread with no children
	p.task(100, 107, 104, 1000) // and a third
	fs := p.fs()
	want := []int{101, 102, 103, 104, 1000}
	for _, hint := range []int{0, 2, 4, 99} {
		got, err := fs.Children(100, hint, nil)
		if err != nil {
			t.Fatalf("hint %d: %v", hint, err)
		}
		if !slices.Equal(sorted(got), want) {
			t.Errorf("Children(100, hint %d) = %v, want %v", hint, sorted(got), want)
		}
	}
	// With a single thread only the main task's file is read.
	got, err := fs.Children(100, 1, nil)
	if err != nil || !slices.Equal(sorted(got), []int{101, 102}) {
		t.Errorf("Children(100, 1) = %v, %v; want the main thread's [101 102]", got, err)
	}
	// It appends to what it is given.
	got, err = fs.Children(100, 0, []int{7})
	if err != nil || got[0] != 7 || len(got) != 6 {
		t.Errorf("Children into [7] = %v, %v", got, err)
	}
	one, err := fs.TaskChildren(100, 105, nil)
	if err != nil || !slices.Equal(one, []int{103}) {
		t.Errorf("TaskChildren(100, 105) = %v, %v", one, err)
	}
	tids, err := fs.Tasks(100)
	if err != nil || !slices.Equal(sorted(tids), []int{100, 105, 106, 107}) {
		t.Errorf("Tasks(100) = %v, %v", tids, err)
	}
}

func TestChildrenFormats(t *testing.T) {
	p := newFakeProc(t)
	p.write("1/task/1/children", "")
	p.write("2/task/2/children", "5")
	p.write("3/task/3/children", "5 6\n")
	p.write("4/task/4/children", "  5   6  ")
	p.write("6/task/6/children", "5 x 6")
	p.write("7/task/7/children", strings.Repeat("123456 ", 2000)) // past the first buffer
	fs := p.fs()
	for pid, want := range map[int][]int{1: nil, 2: {5}, 3: {5, 6}, 4: {5, 6}} {
		got, err := fs.TaskChildren(pid, pid, nil)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("TaskChildren(%d) = %v, %v; want %v", pid, got, err, want)
		}
	}
	if _, err := fs.TaskChildren(6, 6, nil); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("garbage in a children file: %v", err)
	}
	got, err := fs.TaskChildren(7, 7, nil)
	if err != nil || len(got) != 2000 || got[1999] != 123456 {
		t.Errorf("a long children file: %d pids, %v", len(got), err)
	}
	if _, err := fs.TaskChildren(8, 8, nil); !errors.Is(err, ErrNoProcess) {
		t.Errorf("a missing process: %v, want ErrNoProcess", err)
	}
	if _, err := fs.Children(8, 0, nil); !errors.Is(err, ErrNoProcess) {
		t.Errorf("Children of a missing process: %v, want ErrNoProcess", err)
	}
}

func TestChildrenThreadGoneMidWalk(t *testing.T) {
	// A thread listed in task/ whose children file is gone (it exited) is
	// skipped; the others are still read.
	p := newFakeProc(t)
	p.task(50, 50, 51)
	p.task(50, 52, 53)
	if err := os.MkdirAll(filepath.Join(p.root, "50/task/54"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := p.fs().Children(50, 3, nil)
	if err != nil || !slices.Equal(sorted(got), []int{51, 53}) {
		t.Fatalf("Children = %v, %v", got, err)
	}
}

func TestPIDsIgnoresNonNumeric(t *testing.T) {
	p := newFakeProc(t)
	for _, d := range []string{"1", "42", "4194303", "self", "thread-self", "sys", "acpi", "12abc", "-3", "+4", "0x10", "1.5", " 7"} {
		if err := os.MkdirAll(filepath.Join(p.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p.write("uptime", "1.0 2.0\n")
	p.write("99x", "")
	pids, err := p.fs().PIDs()
	if err != nil {
		t.Fatal(err)
	}
	// strconv.Atoi takes "-3" and "+4"; /proc never holds them, but they
	// must not be read as anything else.
	got := sorted(pids)
	for _, want := range []int{1, 42, 4194303} {
		if !slices.Contains(got, want) {
			t.Errorf("PIDs() = %v, missing %d", got, want)
		}
	}
	for _, pid := range got {
		if pid != 1 && pid != 42 && pid != 4194303 && pid != -3 && pid != 4 {
			t.Errorf("PIDs() = %v holds %d", got, pid)
		}
	}
	if _, err := (FS{Root: filepath.Join(p.root, "missing")}).PIDs(); !errors.Is(err, ErrNoProcess) {
		t.Errorf("PIDs of a missing root: %v", err)
	}
}

func TestFakeProcReads(t *testing.T) {
	p := newFakeProc(t)
	want := sampleStat("a) (b")
	want.PID = 77
	p.write("77/stat", statLine(want))
	p.write("77/task/78/stat", statLine(Stat{PID: 78, Comm: "thr", State: 'T', NumThreads: 2, StartTicks: 5}))
	p.write("77/task/78/status", "Name:\tthr\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000040000\n")
	p.write("77/environ", "A=1\x00NEMO_GYM_HARNESS_LAUNCH=run-1\x00")
	p.write("77/cmdline", "/bin/sh\x00-c\x00echo hi\x00")
	p.write("77/wchan", "do_signal_stop")
	p.write("79/stat", "79 (broken")
	fs := p.fs()
	st, err := fs.ReadStat(77)
	if err != nil || st != want {
		t.Fatalf("ReadStat = %+v, %v", st, err)
	}
	ts, err := fs.ReadTaskStat(77, 78)
	if err != nil || ts.PID != 78 || ts.State != 'T' {
		t.Fatalf("ReadTaskStat = %+v, %v", ts, err)
	}
	shd, sig, err := fs.Pending(77, 78)
	if err != nil || shd != SigStop || sig != 0 {
		t.Fatalf("Pending = %#x %#x %v", shd, sig, err)
	}
	if !fs.HasEnv(77, "NEMO_GYM_HARNESS_LAUNCH=run-1") || fs.HasEnv(77, "NEMO_GYM_HARNESS_LAUNCH=run") {
		t.Fatal("HasEnv is not an exact match")
	}
	if got := fs.Cmdline(77); got != "/bin/sh -c echo hi" {
		t.Fatalf("Cmdline = %q", got)
	}
	if got := fs.Wchan(77); got != "do_signal_stop" {
		t.Fatalf("Wchan = %q", got)
	}
	if _, err := fs.ReadStat(80); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("ReadStat of a missing pid: %v", err)
	}
	if _, err := fs.ReadStat(79); err == nil || errors.Is(err, ErrNoProcess) {
		t.Fatalf("ReadStat of a broken stat: %v", err)
	}
	if fs.HasEnv(80, "A=1") || fs.Cmdline(80) != "" || fs.Wchan(80) != "" {
		t.Fatal("a missing process has an environment, a command or a wchan")
	}
	if fs.Alive(procOf(Stat{PID: 77, StartTicks: want.StartTicks + 1})) {
		t.Fatal("Alive with another start time")
	}
	if !fs.Alive(procOf(want)) {
		t.Fatal("not Alive with its own start time")
	}
}

func TestReadStatLongFile(t *testing.T) {
	// A stat longer than ReadStat's first buffer is read whole.
	p := newFakeProc(t)
	want := sampleStat("long")
	want.PID = 5
	line := strings.TrimSuffix(statLine(want), "\n") + strings.Repeat(" 123456789", 100) + "\n"
	p.write("5/stat", line)
	st, err := p.fs().ReadStat(5)
	if err != nil || st != want {
		t.Fatalf("ReadStat = %+v, %v", st, err)
	}
}

// startSleeper starts a copy of sleep under name (which becomes its comm,
// cut to 15 bytes) and registers its end. It is killed by pid.
func startSleeper(t *testing.T, name string) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, name)
	if err := os.Symlink(sleep, path); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func TestReadStatRealNastyNames(t *testing.T) {
	// Real processes whose command names hold the characters that break a
	// naive parser; ReadStat reads them back exactly.
	for _, name := range []string{"a) (b", "with space", "new\nline", strings.Repeat(")", 15), "x) S 1 2 3 4 5 6"} {
		cmd := startSleeper(t, name)
		pid := cmd.Process.Pid
		want := name
		if len(want) > 15 {
			want = want[:15]
		}
		// The comm is set at exec: wait for the child to have exec'd.
		var st Stat
		var err error
		for range 1000 {
			st, err = ProcFS.ReadStat(pid)
			if err == nil && st.Comm == want {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		if st.Comm != want || st.PID != pid || st.PPID != os.Getpid() {
			t.Fatalf("%q: read %+v, want comm %q pid %d ppid %d", name, st, want, pid, os.Getpid())
		}
		if st.StartTicks == 0 || st.NumThreads != 1 {
			t.Fatalf("%q: read %+v", name, st)
		}
	}
}

func TestChildrenForkedByOtherThreads(t *testing.T) {
	// The trap of the notes: /proc/PID/task/TID/children lists only what
	// THAT thread forked. Fork from several locked OS threads of this test
	// process; Children must find every child, each in its forking thread's
	// file, while the main thread's file alone misses most of them.
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	const n = 8
	type forked struct{ tid, pid int }
	results := make(chan forked, n)
	release := make(chan struct{})
	var wg sync.WaitGroup
	var cmds []*exec.Cmd
	var mu sync.Mutex
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cmd := exec.Command(sleep, "300")
			if err := cmd.Start(); err != nil {
				results <- forked{tid: unix.Gettid(), pid: -1}
				return
			}
			mu.Lock()
			cmds = append(cmds, cmd)
			mu.Unlock()
			results <- forked{tid: unix.Gettid(), pid: cmd.Process.Pid}
			<-release // hold the thread (locked) until the check is done
		}()
	}
	defer func() { close(release); wg.Wait() }()
	self := os.Getpid()
	var kids []int
	byThread := map[int][]int{}
	for range n {
		f := <-results
		if f.pid < 0 {
			t.Fatal("could not start sleep")
		}
		kids = append(kids, f.pid)
		byThread[f.tid] = append(byThread[f.tid], f.pid)
	}
	if len(byThread) < 2 {
		t.Fatalf("all %d children were forked by one thread; the test proves nothing", n)
	}
	st, err := ProcFS.ReadStat(self)
	if err != nil {
		t.Fatal(err)
	}
	all, err := ProcFS.Children(self, st.NumThreads, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if !slices.Contains(all, k) {
			t.Errorf("Children(%d) = %v misses child %d", self, all, k)
		}
	}
	for tid, want := range byThread {
		got, err := ProcFS.TaskChildren(self, tid, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range want {
			if !slices.Contains(got, k) {
				t.Errorf("TaskChildren(%d, %d) = %v misses child %d it forked", self, tid, got, k)
			}
		}
	}
	main, err := ProcFS.TaskChildren(self, self, nil)
	if err != nil {
		t.Fatal(err)
	}
	missed := 0
	for _, k := range kids {
		if !slices.Contains(main, k) {
			missed++
		}
	}
	if missed == 0 {
		t.Fatalf("the main thread's children file lists all %d children; no child came from another thread", n)
	}
	t.Logf("%d threads forked %d children; the main thread's file alone misses %d", len(byThread), n, missed)
}

func TestPIDsRealProc(t *testing.T) {
	pids, err := ProcFS.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, os.Getpid()) || !slices.Contains(pids, 1) {
		t.Fatalf("PIDs() misses this process or init: %d pids", len(pids))
	}
	for _, p := range pids {
		if p <= 0 {
			t.Fatalf("PIDs() holds %d", p)
		}
	}
	tids, err := ProcFS.Tasks(os.Getpid())
	if err != nil || !slices.Contains(tids, os.Getpid()) {
		t.Fatalf("Tasks(self) = %v, %v", tids, err)
	}
}

func TestHasEnvRealProcess(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	cmd := exec.Command(sleep, "300")
	cmd.Env = []string{"PATH=/bin", "NEMO_GYM_HARNESS_LAUNCH=ab"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	// The environment is the child's own only once it has exec'd.
	ok := false
	for range 1000 {
		if ProcFS.HasEnv(pid, "NEMO_GYM_HARNESS_LAUNCH=ab") {
			ok = true
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !ok {
		t.Fatal("HasEnv misses the tag of a live process")
	}
	if ProcFS.HasEnv(pid, "NEMO_GYM_HARNESS_LAUNCH=a") {
		t.Fatal(`the tag of launch "ab" matched launch "a"`)
	}
}

// TestParseRunnable reads the runnable count of /proc/loadavg lines, and
// refuses what is not one.
func TestParseRunnable(t *testing.T) {
	for _, tc := range []struct {
		line string
		n    int
		ok   bool
	}{
		{"0.52 0.58 0.59 3/183 3131\n", 3, true},
		{"112.00 220.53 169.01 388/20940 370", 388, true},
		{"0.52 0.58 0.59", 0, false},
		{"0.52 0.58 0.59 x/183 1", 0, false},
		{"0.52 0.58 0.59 183 1", 0, false},
	} {
		if n, ok := parseRunnable([]byte(tc.line)); n != tc.n || ok != tc.ok {
			t.Errorf("parseRunnable(%q) = %d, %v; want %d, %v", tc.line, n, ok, tc.n, tc.ok)
		}
	}
	if w := passWorkers(); w < 1 || w > maxPassWorkers {
		t.Errorf("passWorkers() = %d, want 1 to %d", w, maxPassWorkers)
	}
}
