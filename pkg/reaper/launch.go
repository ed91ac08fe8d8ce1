package reaper

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Launch is one launch folder, opened for a control verb.
type Launch struct {
	// Dir is the launch folder.
	Dir string
	// ID is the launch id: the receipt's, or the one given for a launch
	// that runs without a supervisor (and so has no receipt), whose
	// processes are found by their tag.
	ID string
	// FS is where /proc is read.
	FS FS
	// Receipt is the launch's receipt, nil when none was written yet.
	Receipt *proto.Receipt
	// Supervised says the supervisor named by the receipt is alive (same pid
	// and start time).
	Supervised bool
	// Cgroup is the launch's cgroup, nil when it has none.
	Cgroup *Cgroup
	// ReceiptErr is why the receipt could not be read, when a stop named
	// by id went on without it (found by its tag).
	ReceiptErr error
}

// openFor opens the launch in dir for verb v and derives its state: the one
// entry of every verb but run. id names a launch that keeps no receipt (--id;
// "" for none). With lock (the control verbs: pause, continue, stop) it takes
// the folder's lock, records the folder's origin if none is recorded, and
// derives the state under the lock, after reading the receipt again (the run
// may have started meanwhile); the returned release is then non-nil.
//
// The states that forbid writing in the folder are decided before anything
// is written there, by the verb's cell: Missing (the verb makes the folder,
// or refuses) and Unreadable (the verb refuses, unless its cell lets --id
// name the launch instead, when ReceiptErr says why the receipt was not
// used). A folder the verb cannot write is a bad launch folder: nothing is
// done to any process, and the error says so. It returns the exit code of a
// failure.
func openFor(v Verb, dir, id string, lock bool) (*Launch, State, func(), int, error) {
	fail := func(err error) (*Launch, State, func(), int, error) {
		return nil, Missing, nil, proto.ExitUsage, err
	}
	l, found, err := openFolder(dir)
	if err != nil {
		return fail(err)
	}
	if !found {
		c := Transition(v, Missing)
		if c.Do != Create && (c.Do != CreateWithID || id == "") {
			return fail(refuse(v, Missing, fmt.Errorf("%w: %s does not exist", proto.ErrNoLaunch, l.Dir)))
		}
		if err := l.create(); err != nil {
			return fail(err)
		}
	}
	if err := l.readReceipt(); err != nil {
		if !errors.Is(err, proto.ErrCorruptReceipt) && !errors.Is(err, proto.ErrUnknownVersion) {
			return fail(err)
		}
		if Transition(v, Unreadable).Do != ByTagWithID || id == "" {
			return fail(refuse(v, Unreadable, err))
		}
		l.ReceiptErr = err
	}
	if err := l.Adopt(id); err != nil {
		return fail(err)
	}
	if !lock {
		return l, l.state(looksForCopies(v)), nil, proto.ExitOK, nil
	}
	unlock, err := l.Lock()
	if err != nil {
		return fail(unwritable(err, v.undone()))
	}
	// A launch that keeps no receipt (it runs tagged only, or has not
	// started) is set up by its first control verb: the folder's origin is
	// recorded then, before any snapshot can copy it. Best effort: without
	// it a copy is taken for the launch's own folder, as before.
	recordOrigin(l.Dir)
	if l.ReceiptErr == nil {
		if err := l.Reload(); err != nil && l.Receipt != nil {
			unlock()
			return fail(err)
		}
	}
	return l, l.state(looksForCopies(v)), unlock, proto.ExitOK, nil
}

// openFolder checks dir without reading the receipt; found says the folder
// exists.
func openFolder(dir string) (*Launch, bool, error) {
	dir, err := proto.ValidateDir(dir)
	if err != nil {
		return nil, false, err
	}
	l := &Launch{Dir: dir, FS: ProcFS}
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return l, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w: %v", proto.ErrBadDir, err)
	}
	if !fi.IsDir() {
		return nil, false, fmt.Errorf("%w: %s is not a folder", proto.ErrBadDir, dir)
	}
	return l, true, nil
}

// create makes the launch folder, so that pause or stop can leave their
// file for a run that starts later.
func (l *Launch) create() error {
	if err := os.MkdirAll(l.Dir, 0o755); err != nil {
		return fmt.Errorf("%w: create %s: %v", proto.ErrBadDir, l.Dir, err)
	}
	return nil
}

// readReceipt reads the receipt into l; a folder without one leaves
// Receipt nil.
func (l *Launch) readReceipt() error {
	r, err := proto.ReadReceipt(l.Dir)
	if errors.Is(err, proto.ErrNoLaunch) {
		return nil
	}
	if err != nil {
		return err
	}
	l.Receipt = r
	l.ID = r.ID
	l.Supervised = l.FS.Live(l.supervisor())
	l.Cgroup = OpenCgroup(r.Cgroup, r.CgroupVersion)
	return nil
}

// noReceipt is why a verb that needs a receipt cannot act on a folder that
// holds none.
func (l *Launch) noReceipt() error {
	return fmt.Errorf("%w in %s: it holds no receipt", proto.ErrNoLaunch, l.Dir)
}

// unwritable is the error of a launch folder in which the verb could not
// create its file: exit 2, and nothing was done.
func unwritable(err error, undone string) error {
	return fmt.Errorf("%w: %v; nothing was %s", proto.ErrBadDir, err, undone)
}

// Adopt names the launch when it has no receipt: an unsupervised launch,
// found by its tag. With a receipt, id must match it (or be empty).
func (l *Launch) Adopt(id string) error {
	if id == "" {
		return nil
	}
	if err := proto.ValidateID(id); err != nil {
		return err
	}
	if l.Receipt != nil && l.Receipt.ID != id {
		return fmt.Errorf("%w: the launch in %s is %q, not %q", proto.ErrBadID, l.Dir, l.Receipt.ID, id)
	}
	l.ID = id
	return nil
}

// Reload re-reads the receipt (the supervisor may have written the end).
func (l *Launch) Reload() error {
	r, err := proto.ReadReceipt(l.Dir)
	if err != nil {
		return err
	}
	l.Receipt = r
	l.ID = r.ID
	l.Supervised = l.FS.Live(l.supervisor())
	return nil
}

func (l *Launch) supervisor() proto.Proc {
	if l.Receipt == nil {
		return proto.Proc{}
	}
	return proto.Proc{PID: l.Receipt.SupervisorPID, StartTicks: l.Receipt.SupervisorStartTicks}
}

func (l *Launch) harness() proto.Proc {
	if l.Receipt == nil || !l.Receipt.Started {
		return proto.Proc{}
	}
	return proto.Proc{PID: l.Receipt.HarnessPID, StartTicks: l.Receipt.HarnessStartTicks}
}

func (l *Launch) path(name string) string { return filepath.Join(l.Dir, name) }

// Lock takes the launch folder's lock, which serialises the control verbs and
// the run's start, and returns its release.
func (l *Launch) Lock() (func(), error) {
	return lockDir(l.Dir)
}

func lockDir(dir string) (func(), error) {
	path := filepath.Join(dir, proto.LockFile)
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cannot write in %s: open %s: %w", dir, path, err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// touch creates path if it does not exist, with content. It reports
// whether it created the file. The pause and stop files matter to a live
// sandbox only, so they are not fsynced.
func touch(path string, content string) (bool, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create %s: %w", path, err)
	}
	_, werr := f.WriteString(content)
	if err := errors.Join(werr, f.Close()); err != nil {
		return true, fmt.Errorf("create %s: %w", path, err)
	}
	return true, nil
}

// Caps on what is read of a bookkeeping file (the known and paused sets).
// A record is "pid start" (optionally a third field), at most a few dozen
// bytes, so maxProcSetBytes (16 MiB) holds hundreds of thousands of them. A
// larger file is read from its last maxProcSetBytes, where the newest records
// are; the part before counts as one skipped line. A line longer than
// maxProcSetLine is not a record and is skipped.
const (
	maxProcSetBytes = 16 << 20
	maxProcSetLine  = 256
)

// readProcSet reads a file of "pid start [inode]" lines: a process's pid,
// its start time, and where it was recorded its pidfs inode number (see
// FS.Inode). A missing file is empty. It returns the processes, the inodes
// recorded for them, and how many lines it skipped. It never fails: lines
// that are not records (garbage, a torn last line, a line too long) are
// skipped and counted, and a file that cannot be read counts as one skipped
// line, so that no bookkeeping file can keep a verb from using its other
// ways of finding the launch's processes.
func readProcSet(path string) ([]proto.Proc, map[proto.Proc]uint64, int) {
	inodes := map[proto.Proc]uint64{}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, inodes, 0
	}
	if err != nil {
		return nil, inodes, 1
	}
	defer f.Close()
	skipped := 0
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, inodes, 1
	}
	cut := fi.Size() > maxProcSetBytes
	if cut {
		if _, err := f.Seek(fi.Size()-maxProcSetBytes, io.SeekStart); err != nil {
			return nil, inodes, 1
		}
	}
	data, err := io.ReadAll(io.LimitReader(f, maxProcSetBytes))
	if err != nil {
		skipped++ // what was read is still used
	}
	if cut {
		// The records before the cut, and the line the cut fell in.
		skipped++
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		} else {
			data = nil
		}
	}
	var out []proto.Proc
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		p, ino, ok := parseProcLine(line)
		if !ok {
			skipped++
			continue
		}
		if _, seen := inodes[p]; !seen {
			out = append(out, p)
			inodes[p] = ino
		} else if ino != 0 {
			inodes[p] = ino
		}
	}
	return out, inodes, skipped
}

// parseProcLine parses one "pid start [inode]" record (inode 0 when absent).
func parseProcLine(line []byte) (proto.Proc, uint64, bool) {
	if len(line) > maxProcSetLine {
		return proto.Proc{}, 0, false
	}
	// Split at ASCII white space into at most 3 fields, without the
	// allocation of bytes.Fields (a pause reads the whole known set).
	var fields [3][]byte
	n := 0
	for len(line) > 0 {
		i := 0
		for i < len(line) && isSpace(line[i]) {
			i++
		}
		line = line[i:]
		if len(line) == 0 {
			break
		}
		j := 0
		for j < len(line) && !isSpace(line[j]) {
			j++
		}
		if n == len(fields) {
			return proto.Proc{}, 0, false
		}
		fields[n], line = line[:j], line[j:]
		n++
	}
	if n != 2 && n != 3 {
		return proto.Proc{}, 0, false
	}
	pid, err1 := strconv.Atoi(string(fields[0]))
	start, err2 := strconv.ParseUint(string(fields[1]), 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return proto.Proc{}, 0, false
	}
	var ino uint64
	if n == 3 {
		var err error
		if ino, err = strconv.ParseUint(string(fields[2]), 10, 64); err != nil {
			return proto.Proc{}, 0, false
		}
	}
	return proto.Proc{PID: pid, StartTicks: start}, ino, true
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// formatProcSet writes procs as "pid start [inode]" lines; inode gives each
// one's pidfs inode number, 0 to leave it out.
func formatProcSet(procs []proto.Proc, inode func(proto.Proc) uint64) []byte {
	var b strings.Builder
	for _, p := range procs {
		b.WriteString(strconv.Itoa(p.PID))
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(p.StartTicks, 10))
		if ino := inode(p); ino != 0 {
			b.WriteByte(' ')
			b.WriteString(strconv.FormatUint(ino, 10))
		}
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// noInode leaves the inode out of a set's lines. The paused set is written
// without: recording an inode costs about 11 us a process (2,400 processes:
// some 27 ms on every pause), and a SIGCONT that reaches a process which got
// a paused one's pid within one clock tick wakes it at worst; the known set,
// which stop SIGKILLs by, carries them.
func noInode(proto.Proc) uint64 { return 0 }

// remember appends processes to the launch's known set, each with its pidfs
// inode where the kernel has pidfs (see FS.Inode), so that a process that
// got a recorded one's pid within one clock tick is never taken for it.
func (l *Launch) remember(procs []proto.Proc) error {
	if len(procs) == 0 {
		return nil
	}
	f, err := os.OpenFile(l.path(proto.KnownFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("record known processes: %w", err)
	}
	_, werr := f.Write(formatProcSet(procs, l.FS.Inode))
	return errors.Join(werr, f.Close())
}

// unrecorded returns the processes of procs that the launch's known set does
// not record yet, or records without the pidfs inode this kernel could give
// them. A pause finds every process of the launch again each time, and
// recording one costs a pidfd, its fstat and a second read of its stat
// (about a third of a pause's CPU at 4,000 processes): a process recorded
// once is not recorded again, so the known set grows with the launch's new
// processes, not with every pause. A record that the sandbox forged (a wrong
// inode) makes the known set miss that process, as deleting the file would;
// it never makes a verb signal another process (openAs checks the inode).
func (l *Launch) unrecorded(procs []proto.Proc) []proto.Proc {
	if len(procs) == 0 {
		return nil
	}
	_, inodes, _ := readProcSet(l.path(proto.KnownFile))
	if len(inodes) == 0 {
		return procs
	}
	withInode := l.FS.Root == ProcFS.Root && !noPidfd.Load() && havePidfs()
	out := make([]proto.Proc, 0, len(procs))
	for _, p := range procs {
		if ino, ok := inodes[p]; ok && (ino != 0 || !withInode) {
			continue
		}
		out = append(out, p)
	}
	return out
}
