package gyme2e

// The servers as child processes, and the cleanup that ends exactly what a
// test started: each server by pid (its tree frozen first, so no pid is
// reused under us) and its own process group; what a crashed server left
// running by pid and start time; every launch of the test's sandboxes
// through `ngsup stop`.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one server process of a test, in a process group of its own.
type proc struct {
	name  string
	cmd   *exec.Cmd
	out   *syncBuf // stdout
	errs  *syncBuf // stderr
	done  chan struct{}
	state *os.ProcessState
	start uint64 // start time in clock ticks since boot
}

// syncBuf is a buffer safe for one writer and many readers, copied to a
// file kept in the test's log folder.
type syncBuf struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	file *os.File
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.file != nil {
		b.file.Write(p)
	}
	return b.buf.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startProc starts ngdriver with args in a process group of its own, with
// env added to the test's environment. It dies with the test process.
func startProc(t *testing.T, name, logDir string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, done: make(chan struct{})}
	outF, err := os.Create(filepath.Join(logDir, name+".stdout"))
	if err != nil {
		t.Fatal(err)
	}
	errF, err := os.Create(filepath.Join(logDir, name+".stderr"))
	if err != nil {
		t.Fatal(err)
	}
	p.out, p.errs = &syncBuf{file: outF}, &syncBuf{file: errF}
	p.cmd = exec.Command(ngdriverBin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.errs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p.start, _ = startTicks(p.cmd.Process.Pid)
	go func() {
		p.cmd.Wait()
		p.state = p.cmd.ProcessState
		outF.Close()
		errF.Close()
		close(p.done)
	}()
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

var listenLine = regexp.MustCompile(`listening on (http://[0-9.:\[\]]+)`)

// url waits for the "listening on http://..." line the server prints.
func (p *proc) url(t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if m := listenLine.FindStringSubmatch(p.out.String()); m != nil {
			return m[1]
		}
		if p.exited() {
			t.Fatalf("%s exited (%v) before listening; stderr:\n%s", p.name, p.state, tail(p.errs.String(), 3000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s printed no listening line; stderr:\n%s", p.name, tail(p.errs.String(), 3000))
	return ""
}

// killTree ends the process and its descendants (each stopped as it is
// found, then all killed), and its process group, and waits for it.
func (p *proc) killTree() {
	if !p.exited() {
		for _, pid := range freezeTree(p.pid()) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		syscall.Kill(-p.pid(), syscall.SIGKILL)
	}
	<-p.done
}

// freezeTree stops root and its descendants, top down, and returns them.
func freezeTree(root int) []int {
	order := []int{root}
	seen := map[int]bool{root: true}
	for i := 0; i < len(order); i++ {
		pid := order[i]
		syscall.Kill(pid, syscall.SIGSTOP)
		for range 50 {
			if st, ok := procState(pid); !ok || st == "T" || st == "t" || st == "Z" || st == "X" {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		for _, c := range children(pid) {
			if !seen[c] {
				seen[c] = true
				order = append(order, c)
			}
		}
	}
	return order
}

// children lists pid's children from every thread's children file.
func children(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, f := range tasks {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, w := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(w); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// stat returns the fields of /proc/PID/stat after the command name.
func stat(pid int) ([]string, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, false
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(string(data[i+1:])), true
}

func procState(pid int) (string, bool) {
	f, ok := stat(pid)
	if !ok || len(f) < 1 {
		return "", false
	}
	return f[0], true
}

// startTicks is pid's start time in clock ticks since boot (field 22).
func startTicks(pid int) (uint64, bool) {
	f, ok := stat(pid)
	if !ok || len(f) < 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return v, err == nil
}

// procInfo is a live process found by a scan.
type procInfo struct {
	pid     int
	start   uint64
	state   string
	cmdline string
}

func (p procInfo) String() string {
	return fmt.Sprintf("pid %d state %s cmd %q", p.pid, p.state, p.cmdline)
}

func readProc(pid int) (procInfo, bool) {
	info := procInfo{pid: pid}
	f, ok := stat(pid)
	if !ok || len(f) < 20 {
		return info, false
	}
	info.state = f[0]
	info.start, _ = strconv.ParseUint(f[19], 10, 64)
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		info.cmdline = strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " "))
	}
	return info, true
}

// recordedLeftovers lists the processes the fake harness recorded in the
// pids files of its sessions under base that still run: same pid, younger
// than the test's first process, and the command line the harness gave it.
func recordedLeftovers(base string, since uint64) []procInfo {
	files, _ := filepath.Glob(filepath.Join(base, "sandboxes", "*", ".ngharness", "state", "fake", "*", "pids"))
	seen := map[int]bool{}
	var out []procInfo
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			kind, pidText, ok := strings.Cut(strings.TrimSpace(line), " ")
			if !ok {
				continue
			}
			pid, err := strconv.Atoi(pidText)
			if err != nil || seen[pid] {
				continue
			}
			seen[pid] = true
			info, ok := readProc(pid)
			if !ok || info.state == "Z" || info.start < since {
				continue
			}
			var match bool
			switch kind {
			case "harness":
				match = strings.Contains(info.cmdline, "fake-harness.sh")
			case "daemon":
				match = strings.Contains(info.cmdline, `echo "daemon`)
			default:
				match = info.cmdline == "sleep 100000"
			}
			if match {
				out = append(out, info)
			}
		}
	}
	return out
}

// stopLaunches runs `ngsup stop --grace 0s` on every launch folder of the
// sandboxes under base and reports the ones that failed.
func stopLaunches(t *testing.T, base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, "sandboxes", "*", ".ngharness", "launches", "*"))
	slices.Sort(dirs)
	for _, d := range dirs {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		out, err := exec.CommandContext(ctx, ngsupBin, "stop", "--grace", "0s", "--dir", d).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("cleanup: ngsup stop --dir %s: %v: %s", d, err, bytes.TrimSpace(out))
		}
	}
}

// killLeftovers sends SIGKILL by pid to processes whose start time did not
// change since they were found.
func killLeftovers(ps []procInfo) {
	for _, p := range ps {
		if st, ok := startTicks(p.pid); ok && st == p.start {
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

// orphans remembers the descendants of a server killed alone (a crash),
// by pid and start time, to end those still running at cleanup.
type orphans struct {
	mu   sync.Mutex
	list []procInfo
}

func (o *orphans) add(root int) {
	var found []procInfo
	seen := map[int]bool{}
	var walk func(int)
	walk = func(pid int) {
		for _, c := range children(pid) {
			if seen[c] {
				continue
			}
			seen[c] = true
			if info, ok := readProc(c); ok {
				found = append(found, info)
			}
			walk(c)
		}
	}
	walk(root)
	o.mu.Lock()
	o.list = append(o.list, found...)
	o.mu.Unlock()
}

func (o *orphans) kill() {
	o.mu.Lock()
	defer o.mu.Unlock()
	killLeftovers(o.list)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// errorsIn returns the lines of a server's stderr that report a data race
// or a panic.
func errorsIn(stderr string) []string {
	var out []string
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "DATA RACE") || strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
			out = append(out, line)
		}
	}
	return out
}
