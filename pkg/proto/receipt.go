package proto

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
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
	// Check the msgpack framing before decoding: msgpack allocates what a
	// length header claims, so eight bytes of garbage claiming a 4 GiB string
	// would otherwise take 4 GiB (found by FuzzDecodeReceipt).
	if c := data[0]; !(c >= 0x80 && c <= 0x8f) && c != 0xde && c != 0xdf {
		return nil, fmt.Errorf("%w: not a msgpack map (first byte %#02x)", ErrCorruptReceipt, c)
	}
	end, err := scanMsgpack(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptReceipt, err)
	}
	if end < len(data) {
		return nil, fmt.Errorf("%w: %d bytes of trailing garbage", ErrCorruptReceipt, len(data)-end)
	}
	// Read the version alone first, so a future format that changed other
	// fields is reported as a version, not as garbage.
	var version any
	if err := decodeSafely(func() (err error) { version, err = readVersion(data); return err }); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrCorruptReceipt, describeDecodeError(err))
	}
	v, ok := asInt(version)
	if !ok {
		return nil, fmt.Errorf("%w: no format version field", ErrCorruptReceipt)
	}
	if v != ReceiptVersion {
		return nil, fmt.Errorf("%w: version %d (this build reads %d)", ErrUnknownVersion, v, ReceiptVersion)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	var r Receipt
	if err := decodeSafely(func() error { return dec.Decode(&r) }); err != nil {
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

// readVersion returns the value of the receipt map's "v" key (the last one
// if the key repeats), nil when there is none. Each value is decoded fresh:
// decoding a repeated key into the same interface makes msgpack panic
// (found by FuzzDecodeReceipt).
func readVersion(data []byte) (any, error) {
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	n, err := dec.DecodeMapLen()
	if err != nil {
		return nil, err
	}
	var version any
	for range max(n, 0) {
		key, err := dec.DecodeString()
		if err != nil {
			return nil, err
		}
		if key != "v" {
			if err := dec.Skip(); err != nil {
				return nil, err
			}
			continue
		}
		if version, err = dec.DecodeInterface(); err != nil {
			return nil, err
		}
	}
	return version, nil
}

// decodeSafely runs f and turns a panic inside the msgpack library into an
// error: a receipt is bytes from a disk, and no bytes may crash ngsup.
func decodeSafely(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("undecodable msgpack (%v)", p)
		}
	}()
	return f()
}

// maxReceiptDepth bounds how deeply a receipt's msgpack may nest. A receipt
// nests two levels (the map, the command's array); the slack leaves room
// for fields a later format adds.
const maxReceiptDepth = 32

// errTruncated is what scanMsgpack returns when a value runs past the end.
var errTruncated = errors.New("the file is truncated")

// scanMsgpack walks the msgpack value at the start of data without decoding
// it, and returns where it ends. It fails when a length runs past the end of
// data (so no length header can claim more than the file holds), on a byte
// msgpack never uses, and when containers nest deeper than maxReceiptDepth.
// It allocates nothing but its stack of open containers.
func scanMsgpack(data []byte) (int, error) {
	var stack [maxReceiptDepth + 1]int // items left in each open container
	depth := 1
	stack[0] = 1 // one value at the top
	i := 0
	for depth > 0 {
		if stack[depth-1] == 0 {
			depth--
			continue
		}
		stack[depth-1]--
		if i >= len(data) {
			return i, errTruncated
		}
		at := i
		c := data[i]
		i++
		var hdr, skip, items int // length-header bytes, payload bytes, child values
		switch {
		case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c <= 0x8f:
			items = 2 * int(c&0x0f)
		case c <= 0x9f:
			items = int(c & 0x0f)
		case c <= 0xbf:
			skip = int(c & 0x1f)
		case c == 0xc4, c == 0xd9: // bin8, str8
			hdr = 1
		case c == 0xc5, c == 0xda: // bin16, str16
			hdr = 2
		case c == 0xc6, c == 0xdb: // bin32, str32
			hdr = 4
		case c == 0xc7: // ext8: length, type, data
			hdr, skip = 1, 1
		case c == 0xc8:
			hdr, skip = 2, 1
		case c == 0xc9:
			hdr, skip = 4, 1
		case c == 0xca, c == 0xce, c == 0xd2: // 32-bit numbers
			skip = 4
		case c == 0xcb, c == 0xcf, c == 0xd3: // 64-bit numbers
			skip = 8
		case c == 0xcc, c == 0xd0:
			skip = 1
		case c == 0xcd, c == 0xd1:
			skip = 2
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc, c == 0xde: // array16, map16
			hdr = 2
		case c == 0xdd, c == 0xdf: // array32, map32
			hdr = 4
		default: // 0xc1
			return at, fmt.Errorf("byte %#02x at offset %d is not msgpack", c, at)
		}
		if hdr > 0 {
			if len(data)-i < hdr {
				return i, errTruncated
			}
			n := 0
			for _, b := range data[i : i+hdr] {
				n = n<<8 | int(b)
			}
			i += hdr
			switch {
			case c == 0xdc || c == 0xdd:
				items = n
			case c == 0xde || c == 0xdf:
				items = 2 * n
			default:
				skip += n
			}
		}
		if len(data)-i < skip {
			return i, errTruncated
		}
		i += skip
		if items > 0 {
			// Every item takes at least a byte.
			if items > len(data)-i {
				return i, errTruncated
			}
			if depth == len(stack) {
				return at, fmt.Errorf("nested more than %d levels deep at offset %d", maxReceiptDepth, at)
			}
			stack[depth] = items
			depth++
		}
	}
	return i, nil
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

// MaxReceiptBytes caps the size of a receipt that is read (and written). A
// receipt holds a few ids, times and the harness's argv, which the kernel
// bounds to a few MiB; 16 MiB leaves room for that and keeps a corrupt or
// hostile file (a sparse file of 4 GiB, say) from being read into memory.
const MaxReceiptBytes = 16 << 20

// ReadReceipt reads dir's receipt. A missing file is ErrNoLaunch; a receipt
// that cannot be read is ErrBadDir (an unreadable launch folder), one over
// MaxReceiptBytes, or one that does not decode, ErrCorruptReceipt.
func ReadReceipt(dir string) (*Receipt, error) {
	path := filepath.Join(dir, ReceiptFile)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s: it holds no receipt", ErrNoLaunch, dir)
	}
	if errors.Is(err, syscall.ENOTDIR) {
		return nil, fmt.Errorf("%w: %s is not a folder", ErrBadDir, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read receipt: %v", ErrBadDir, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > MaxReceiptBytes {
		return nil, fmt.Errorf("read %s: %w: the file is %d bytes, the limit is %d", path, ErrCorruptReceipt, fi.Size(), MaxReceiptBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxReceiptBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read receipt: %v", ErrBadDir, err)
	}
	if len(data) > MaxReceiptBytes {
		return nil, fmt.Errorf("read %s: %w: the file is over the limit of %d bytes", path, ErrCorruptReceipt, MaxReceiptBytes)
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
	if len(data) > MaxReceiptBytes {
		return fmt.Errorf("encode receipt: %d bytes, over the limit of %d that a reader accepts", len(data), MaxReceiptBytes)
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
