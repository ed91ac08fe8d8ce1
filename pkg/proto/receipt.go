package proto

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// ReceiptVersion is the receipt format this build writes and reads.
const ReceiptVersion = 1

// Receipt is a launch's record on the sandbox's disk, written by the
// supervisor when it starts, when the harness starts and when it ends (and by
// stop when the supervisor is gone). It is msgpack on disk and one line of
// JSON when a verb prints it.
type Receipt struct {
	// Version is the format version (ReceiptVersion).
	Version int `msgpack:"v" json:"v"`
	// ID is the launch id, also the value of TagEnv in every process.
	ID string `msgpack:"id" json:"id"`
	// Command is the harness's argv.
	Command []string `msgpack:"command" json:"command"`
	// SupervisorPID and SupervisorStartTicks identify the supervisor (start
	// time in clock ticks, field 22 of /proc/PID/stat).
	SupervisorPID        int    `msgpack:"supervisor_pid" json:"supervisor_pid"`
	SupervisorStartTicks uint64 `msgpack:"supervisor_start_ticks" json:"supervisor_start_ticks"`
	// Started says the harness was started; until then the run waits (pause
	// file) or never starts (stop file).
	Started bool `msgpack:"started" json:"started"`
	// HarnessPID, HarnessPGID and HarnessStartTicks identify the harness and
	// its process group (the harness leads its own group).
	HarnessPID        int    `msgpack:"harness_pid" json:"harness_pid"`
	HarnessPGID       int    `msgpack:"harness_pgid" json:"harness_pgid"`
	HarnessStartTicks uint64 `msgpack:"harness_start_ticks" json:"harness_start_ticks"`
	// Cgroup is the path of the launch's own cgroup ("" when the sandbox let
	// ngsup make none) and CgroupVersion its hierarchy (1 or 2, 0 for none).
	Cgroup        string `msgpack:"cgroup" json:"cgroup,omitempty"`
	CgroupVersion int    `msgpack:"cgroup_version" json:"cgroup_version,omitempty"`
	// StartedAt is when the harness started; EndedAt when the end was recorded.
	StartedAt time.Time `msgpack:"started_at" json:"started_at,omitzero"`
	EndedAt   time.Time `msgpack:"ended_at" json:"ended_at,omitzero"`
	// Ended says the launch is over: the harness exited (or never started
	// because of a stop file, or could not be run).
	Ended bool `msgpack:"ended" json:"ended"`
	// ExitCode is the harness's exit code, 128+N when signal N killed it, 127
	// or 126 when it could not be run, -1 when unknown.
	ExitCode int `msgpack:"exit_code" json:"exit_code"`
	// Signal is the signal that killed the harness, 0 if none.
	Signal int `msgpack:"signal" json:"signal,omitempty"`
	// TimedOut says the run's --timeout ended the harness.
	TimedOut bool `msgpack:"timed_out" json:"timed_out,omitempty"`
	// CleanupConfirmed says that after the harness exited nothing was left in
	// its process group.
	CleanupConfirmed bool `msgpack:"cleanup_confirmed" json:"cleanup_confirmed"`
	// Error is a one-line reason when something went wrong ("" otherwise).
	Error string `msgpack:"error" json:"error,omitempty"`
}

// EncodeReceipt returns r as msgpack.
func EncodeReceipt(r *Receipt) ([]byte, error) {
	return msgpack.Marshal(r)
}

// DecodeReceipt parses and validates a receipt. Every failure wraps
// ErrCorruptReceipt or ErrUnknownVersion and says what is wrong.
func DecodeReceipt(data []byte) (*Receipt, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: the file is empty", ErrCorruptReceipt)
	}
	// Read the version alone first, so a future format that changed other
	// fields is reported as a version, not as garbage.
	var head struct {
		Version any `msgpack:"v"`
	}
	if err := msgpack.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrCorruptReceipt, describeDecodeError(err))
	}
	v, ok := asInt(head.Version)
	if !ok {
		return nil, fmt.Errorf("%w: no format version field", ErrCorruptReceipt)
	}
	if v != ReceiptVersion {
		return nil, fmt.Errorf("%w: version %d (this build reads %d)", ErrUnknownVersion, v, ReceiptVersion)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	var r Receipt
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrCorruptReceipt, describeDecodeError(err))
	}
	if rest, _ := dec.Buffered().(*bytes.Reader); rest != nil && rest.Len() > 0 {
		return nil, fmt.Errorf("%w: %d bytes of trailing garbage", ErrCorruptReceipt, rest.Len())
	}
	if err := ValidateID(r.ID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptReceipt, err)
	}
	if r.SupervisorPID <= 0 {
		return nil, fmt.Errorf("%w: supervisor pid %d", ErrCorruptReceipt, r.SupervisorPID)
	}
	if r.Started && (r.HarnessPID <= 0 || r.HarnessPGID <= 0) {
		return nil, fmt.Errorf("%w: started but harness pid %d, pgid %d", ErrCorruptReceipt, r.HarnessPID, r.HarnessPGID)
	}
	return &r, nil
}

func asInt(v any) (int, bool) {
	switch n := v.(type) {
	case int8:
		return int(n), true
	case int16:
		return int(n), true
	case int32:
		return int(n), true
	case int64:
		return int(n), true
	case uint8:
		return int(n), true
	case uint16:
		return int(n), true
	case uint32:
		return int(n), true
	case uint64:
		if n > 1<<31 {
			return 0, false
		}
		return int(n), true
	}
	return 0, false
}

func describeDecodeError(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "the file is truncated"
	}
	return err.Error()
}

// ReadReceipt reads dir's receipt. A missing file is ErrNoLaunch.
func ReadReceipt(dir string) (*Receipt, error) {
	path := filepath.Join(dir, ReceiptFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s: it holds no receipt", ErrNoLaunch, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("read receipt: %w", err)
	}
	r, err := DecodeReceipt(data)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return r, nil
}

// WriteReceipt replaces dir's receipt atomically.
func WriteReceipt(dir string, r *Receipt) error {
	r.Version = ReceiptVersion
	data, err := EncodeReceipt(r)
	if err != nil {
		return fmt.Errorf("encode receipt: %w", err)
	}
	return WriteFileAtomic(filepath.Join(dir, ReceiptFile), data, 0o644)
}

// WriteFileAtomic writes data to path so that a reader sees either the old
// file or the whole new one, and a crash leaves one of them on disk: a temp
// file in the same folder, fsync, rename, fsync of the folder.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return replaceFile(path, data, perm, true)
}

// ReplaceFile is WriteFileAtomic without the fsyncs: readers still see the
// old file or the new one whole, but a machine crash may lose the change. For
// files only a live sandbox needs.
func ReplaceFile(path string, data []byte, perm os.FileMode) error {
	return replaceFile(path, data, perm, false)
}

func replaceFile(path string, data []byte, perm os.FileMode, durable bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	name := tmp.Name()
	fail := func(err error) error {
		tmp.Close()
		os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fail(err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			return fail(err)
		}
	}
	if err := tmp.Close(); err != nil {
		os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if !durable {
		return nil
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a folder so that a rename or create in it is durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync folder %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync folder %s: %w", dir, err)
	}
	return nil
}
