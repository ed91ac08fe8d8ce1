package reaper

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FS reads a proc filesystem mounted at Root ("/proc" for the real one).
type FS struct {
	Root string
}

// ProcFS is the real /proc.
var ProcFS = FS{Root: "/proc"}

// Stat is what ngsup needs from /proc/PID/stat (or a thread's stat).
type Stat struct {
	PID        int
	Comm       string
	State      byte
	PPID       int
	PGID       int
	SID        int
	UTime      uint64 // clock ticks in user mode
	STime      uint64 // clock ticks in kernel mode
	NumThreads int
	StartTicks uint64
}

func (fs FS) pidPath(pid int, rest string) string {
	return fs.Root + "/" + strconv.Itoa(pid) + rest
}

// readFile reads a small /proc file with plain syscalls (no poller, no stat),
// because pausing a thousand processes reads thousands of them.
func readFile(path string, buf []byte) ([]byte, error) {
	return readProcFile(path, buf, false)
}

// readLineFile is readFile for a file of one line that the kernel writes
// whole at the first read (a stat file: its text is made in one go and
// copied as far as the buffer holds): a first read that leaves room in the
// buffer and ends with the line's newline is the whole file, and the read
// that would return 0 is saved (one syscall of seven per process a pause
// reaches). Anything else is read on to the end as readFile does.
func readLineFile(path string, buf []byte) ([]byte, error) {
	return readProcFile(path, buf, true)
}

func readProcFile(path string, buf []byte, line bool) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOENT || err == unix.ESRCH {
			return nil, ErrNoProcess
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf)+512)...)
		}
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if err == unix.ESRCH {
				return nil, ErrNoProcess
			}
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
		if line && n == m && n < len(buf) && buf[n-1] == '\n' {
			return buf[:n], nil
		}
	}
}

// ReadStat reads /proc/PID/stat.
func (fs FS) ReadStat(pid int) (Stat, error) {
	var buf [512]byte
	data, err := readLineFile(fs.pidPath(pid, "/stat"), buf[:])
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(data)
}

// ReadTaskStat reads /proc/PID/task/TID/stat.
func (fs FS) ReadTaskStat(pid, tid int) (Stat, error) {
	var buf [512]byte
	data, err := readLineFile(fs.pidPath(pid, "/task/"+strconv.Itoa(tid)+"/stat"), buf[:])
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(data)
}

// ParseStat parses the text of a stat file. The command name sits between
// the first '(' and the LAST ')', and may itself hold spaces, parentheses and
// newlines.
func ParseStat(data []byte) (Stat, error) {
	var s Stat
	open := bytes.IndexByte(data, '(')
	closeIdx := bytes.LastIndexByte(data, ')')
	if open < 1 || closeIdx < open {
		return s, fmt.Errorf("parse stat: no command name in %q", truncate(data))
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(data[:open])))
	if err != nil {
		return s, fmt.Errorf("parse stat: bad pid in %q", truncate(data))
	}
	s.PID = pid
	s.Comm = string(data[open+1 : closeIdx])
	rest := data[closeIdx+1:]
	// Fields after the name, numbered from 3 (state) as in proc(5).
	field := 2
	// Fields are split at spaces and newlines alike, so that no field (the
	// state, say) can be read as a newline.
	for len(rest) > 0 {
		for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\n') {
			rest = rest[1:]
		}
		end := 0
		for end < len(rest) && rest[end] != ' ' && rest[end] != '\n' {
			end++
		}
		tok := rest[:end]
		rest = rest[end:]
		if len(tok) == 0 {
			continue
		}
		field++
		switch field {
		case 3:
			s.State = tok[0]
		case 4:
			s.PPID, err = atoi(tok)
		case 5:
			s.PGID, err = atoi(tok)
		case 6:
			s.SID, err = atoi(tok)
		case 14:
			s.UTime, err = atou(tok)
		case 15:
			s.STime, err = atou(tok)
		case 20:
			s.NumThreads, err = atoi(tok)
		case 22:
			s.StartTicks, err = atou(tok)
			if err != nil {
				return s, fmt.Errorf("parse stat of %d: field %d: %w", pid, field, err)
			}
			return s, nil
		}
		if err != nil {
			return s, fmt.Errorf("parse stat of %d: field %d: %w", pid, field, err)
		}
	}
	return s, fmt.Errorf("parse stat of %d: only %d fields", pid, field)
}

func truncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}

func atoi(b []byte) (int, error) {
	n, err := strconv.ParseInt(string(b), 10, 64)
	return int(n), err
}

func atou(b []byte) (uint64, error) {
	return strconv.ParseUint(string(b), 10, 64)
}

// Tasks lists the thread ids of pid (/proc/PID/task).
func (fs FS) Tasks(pid int) ([]int, error) {
	return fs.listInts(fs.pidPath(pid, "/task"))
}

// PIDs lists every process in the proc filesystem.
func (fs FS) PIDs() ([]int, error) {
	return fs.listInts(fs.Root)
}

func (fs FS) listInts(dir string) ([]int, error) {
	f, err := os.Open(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return nil, ErrNoProcess
		}
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) {
			return nil, ErrNoProcess
		}
		return nil, err
	}
	out := make([]int, 0, len(names))
	for _, n := range names {
		if v, err := strconv.Atoi(n); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// TaskChildren reads /proc/PID/task/TID/children: the children forked by
// that one thread.
func (fs FS) TaskChildren(pid, tid int, into []int) ([]int, error) {
	var buf [1024]byte
	data, err := readFile(fs.pidPath(pid, "/task/"+strconv.Itoa(tid)+"/children"), buf[:])
	if err != nil {
		return into, err
	}
	for len(data) > 0 {
		end := bytes.IndexByte(data, ' ')
		if end < 0 {
			end = len(data)
		}
		tok := bytes.TrimSpace(data[:end])
		data = data[end:]
		if len(data) > 0 {
			data = data[1:]
		}
		if len(tok) == 0 {
			continue
		}
		v, err := atoi(tok)
		if err != nil {
			return into, fmt.Errorf("parse children of %d/%d: %q", pid, tid, tok)
		}
		into = append(into, v)
	}
	return into, nil
}

// Children lists the children of every thread of pid. numThreads is a hint
// from its stat: with one thread the task folder is not listed.
func (fs FS) Children(pid, numThreads int, into []int) ([]int, error) {
	if numThreads == 1 {
		return fs.TaskChildren(pid, pid, into)
	}
	tids, err := fs.Tasks(pid)
	if err != nil {
		return into, err
	}
	for _, tid := range tids {
		into, err = fs.TaskChildren(pid, tid, into)
		if err != nil && !errors.Is(err, ErrNoProcess) {
			return into, err
		}
	}
	return into, nil
}

// SigStop is SIGSTOP's bit in the pending-signal masks of /proc/PID/status.
const SigStop = uint64(1) << (unix.SIGSTOP - 1)

// Pending reads the shared and per-thread pending-signal masks (ShdPnd and
// SigPnd) of /proc/PID/task/TID/status.
func (fs FS) Pending(pid, tid int) (shared, thread uint64, err error) {
	var buf [2048]byte
	data, err := readFile(fs.pidPath(pid, "/task/"+strconv.Itoa(tid)+"/status"), buf[:])
	if err != nil {
		return 0, 0, err
	}
	return ParsePending(data)
}

// stopPending reports whether a SIGSTOP is pending for pid (shared or for
// its main thread): it takes that stop when it next returns to user space.
func (fs FS) stopPending(pid int) bool {
	shd, sig, err := fs.Pending(pid, pid)
	return err == nil && (shd|sig)&SigStop != 0
}

// ParsePending extracts ShdPnd and SigPnd from the text of a status file.
func ParsePending(data []byte) (shared, thread uint64, err error) {
	var haveShd, haveSig bool
	for len(data) > 0 {
		end := bytes.IndexByte(data, '\n')
		if end < 0 {
			end = len(data)
		}
		line := data[:end]
		data = data[min(end+1, len(data)):]
		key, val, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		switch string(key) {
		case "ShdPnd":
			shared, err = strconv.ParseUint(string(bytes.TrimSpace(val)), 16, 64)
			haveShd = true
		case "SigPnd":
			thread, err = strconv.ParseUint(string(bytes.TrimSpace(val)), 16, 64)
			haveSig = true
		}
		if err != nil {
			return 0, 0, fmt.Errorf("parse status: %s: %w", key, err)
		}
	}
	if !haveShd || !haveSig {
		return 0, 0, errors.New("parse status: no ShdPnd/SigPnd lines")
	}
	return shared, thread, nil
}

// Wchan reads /proc/PID/wchan: the kernel function the process sleeps in.
func (fs FS) Wchan(pid int) string {
	var buf [128]byte
	data, err := readFile(fs.pidPath(pid, "/wchan"), buf[:])
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(data))
}

// Cmdline reads /proc/PID/cmdline as one line, arguments joined by spaces.
func (fs FS) Cmdline(pid int) string {
	data, err := readFile(fs.pidPath(pid, "/cmdline"), make([]byte, 1024))
	if err != nil {
		return ""
	}
	data = bytes.TrimRight(data, "\x00")
	return strings.ReplaceAll(string(data), "\x00", " ")
}

// HasEnv reports whether pid's environment holds the exact entry
// "key=value". A process whose environment cannot be read does not have it.
func (fs FS) HasEnv(pid int, entry string) bool {
	data, err := readFile(fs.pidPath(pid, "/environ"), make([]byte, 4096))
	if err != nil {
		return false
	}
	return EnvironHas(data, entry)
}

// EnvironHas reports whether a NUL-separated environ block holds entry
// exactly (so the tag of launch "a" does not match launch "ab").
func EnvironHas(environ []byte, entry string) bool {
	for len(environ) > 0 {
		end := bytes.IndexByte(environ, 0)
		if end < 0 {
			end = len(environ)
		}
		if string(environ[:end]) == entry {
			return true
		}
		environ = environ[min(end+1, len(environ)):]
	}
	return false
}
