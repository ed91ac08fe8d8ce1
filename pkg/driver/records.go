package driver

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/proto"
)

// RecordsVersion is the format of the records files a commit writes.
const RecordsVersion = 1

// ErrBadRecords: a records file is truncated, malformed, or of a version
// this build does not read.
var ErrBadRecords = errors.New("bad checkpoint records")

// recordsLine is one line of a records file. The first line is a header,
// then one line per run, then an end line, written last, whose count and
// SHA-256 (of every byte before the end line) let a reader tell a whole file
// from a truncated or altered one. Files of earlier builds have no SHA-256 in
// their end line; they are read with the count check alone.
type recordsLine struct {
	V            int             `json:"v"`
	Kind         string          `json:"kind"` // "header", "run", "end"
	CheckpointID string          `json:"checkpoint_id,omitempty"`
	Participant  string          `json:"participant,omitempty"`
	WrittenAt    *time.Time      `json:"written_at,omitempty"`
	RolloutID    string          `json:"rollout_id,omitempty"`
	Attempt      int             `json:"attempt,omitempty"`
	Bookmark     json.RawMessage `json:"bookmark,omitempty"`
	Count        *int            `json:"count,omitempty"`
	SHA256       string          `json:"sha256,omitempty"`
}

// RecordsPath is where participant writes its records for a checkpoint:
// <checkpoint_dir>/gym/records-<participant>.jsonl.
func RecordsPath(checkpointDir, participant string) string {
	return filepath.Join(checkpointDir, "gym", "records-"+participant+".jsonl")
}

// WriteRecords writes records durably (temp file, fsync, rename, fsync of
// the folder), so a crash leaves either no file or the whole file.
func WriteRecords(checkpointDir, participant, checkpointID string, records []Record) (string, error) {
	if checkpointDir == "" || !filepath.IsAbs(checkpointDir) {
		return "", fmt.Errorf("%w: checkpoint_dir %q is not an absolute path", ErrBadRequest, checkpointDir)
	}
	if err := proto.ValidateID(participant); err != nil {
		return "", fmt.Errorf("%w: participant name: %v", ErrBadRequest, err)
	}
	path := RecordsPath(checkpointDir, participant)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("write records: %w", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	now := time.Now().UTC()
	n := len(records)
	lines := []recordsLine{{V: RecordsVersion, Kind: "header", CheckpointID: checkpointID, Participant: participant, WrittenAt: &now, Count: &n}}
	for _, r := range records {
		lines = append(lines, recordsLine{V: RecordsVersion, Kind: "run", RolloutID: r.RolloutID, Attempt: r.Attempt, Bookmark: r.Bookmark})
	}
	for _, l := range lines {
		if err := enc.Encode(l); err != nil {
			return "", fmt.Errorf("write records: %w", err)
		}
	}
	sum := sha256.Sum256(buf.Bytes())
	if err := enc.Encode(recordsLine{V: RecordsVersion, Kind: "end", Count: &n, SHA256: hex.EncodeToString(sum[:])}); err != nil {
		return "", fmt.Errorf("write records: %w", err)
	}
	if err := proto.WriteFileAtomic(path, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("write records: %w", err)
	}
	return path, nil
}

// ReadRecords reads the records of a checkpoint for participant: its own
// file, which must be there and whole (a commit writes it even when it
// exported no run), and every other records-*.jsonl file of the checkpoint.
// It returns their runs, validated. A missing, truncated or altered file
// fails the whole read with an error that names the file (and the line):
// nothing half-read is ever installed, and a restore never succeeds having
// read nothing because the commit died before its file was in place.
func ReadRecords(checkpointDir, participant, checkpointID string) ([]Record, error) {
	if checkpointDir == "" || !filepath.IsAbs(checkpointDir) {
		return nil, fmt.Errorf("%w: checkpoint_dir %q is not an absolute path", ErrBadRequest, checkpointDir)
	}
	if err := proto.ValidateID(participant); err != nil {
		return nil, fmt.Errorf("%w: participant name: %v", ErrBadRequest, err)
	}
	if _, err := os.Stat(checkpointDir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: checkpoint_dir %s does not exist", ErrBadRecords, checkpointDir)
	}
	own := RecordsPath(checkpointDir, participant)
	if _, err := os.Stat(own); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %v", ErrBadRecords, err)
		}
		temps, _ := filepath.Glob(filepath.Join(filepath.Dir(own), "."+filepath.Base(own)+".tmp-*"))
		if len(temps) > 0 {
			return nil, fmt.Errorf("%w: %s is missing and only the temporary file %s is there: the commit of checkpoint %s died while writing its records", ErrBadRecords, own, temps[0], checkpointID)
		}
		return nil, fmt.Errorf("%w: %s is missing: participant %s never committed checkpoint %s into %s", ErrBadRecords, own, participant, checkpointID, checkpointDir)
	}
	files, err := filepath.Glob(filepath.Join(checkpointDir, "gym", "records-*.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	slices.Sort(files)
	out := []Record{}
	seen := map[string]string{}
	for _, f := range files {
		recs, err := readRecordsFile(f, checkpointID)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			if other, dup := seen[r.RolloutID]; dup {
				return nil, fmt.Errorf("%w: rollout %s is in both %s and %s", ErrBadRecords, r.RolloutID, other, f)
			}
			seen[r.RolloutID] = f
		}
		out = append(out, recs...)
	}
	return out, nil
}

func readRecordsFile(path, checkpointID string) ([]Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	bad := func(line int, format string, args ...any) error {
		return fmt.Errorf("%w: %s line %d: %s", ErrBadRecords, path, line, fmt.Sprintf(format, args...))
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: %s is empty", ErrBadRecords, path)
	}
	if data[len(data)-1] != '\n' {
		return nil, bad(bytes.Count(data, []byte("\n"))+1, "the line is cut (the file is truncated)")
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	var out []Record
	var header *recordsLine
	ended := false
	offset := 0 // of the line being read
	n := 1
	for ; sc.Scan(); n++ {
		raw := sc.Bytes()
		at := offset
		offset += len(raw) + 1
		text := strings.TrimSpace(string(raw))
		if text == "" {
			continue
		}
		if ended {
			return nil, bad(n, "data after the end line")
		}
		var l recordsLine
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return nil, bad(n, "not a record: %v", err)
		}
		if l.V != RecordsVersion {
			return nil, fmt.Errorf("%w: %s line %d: unknown version %d (this build reads %d)", ErrBadRecords, path, n, l.V, RecordsVersion)
		}
		switch {
		case header == nil && l.Kind != "header":
			return nil, bad(n, "the first line is not the header")
		case l.Kind == "header":
			if header != nil {
				return nil, bad(n, "a second header")
			}
			if checkpointID != "" && l.CheckpointID != checkpointID {
				return nil, bad(n, "records of checkpoint %q, not %q", l.CheckpointID, checkpointID)
			}
			header = &l
		case l.Kind == "run":
			if l.RolloutID == "" {
				return nil, bad(n, "a run without rollout_id")
			}
			if _, err := ParseBookmark(l.Bookmark); err != nil {
				return nil, bad(n, "rollout %s: %v", l.RolloutID, err)
			}
			out = append(out, Record{RolloutID: l.RolloutID, Attempt: l.Attempt, Bookmark: l.Bookmark})
		case l.Kind == "end":
			if l.Count == nil || *l.Count != len(out) {
				return nil, bad(n, "the end line counts %v runs, the file holds %d", l.Count, len(out))
			}
			if header.Count != nil && *header.Count != len(out) {
				return nil, bad(n, "the header counts %d runs, the file holds %d", *header.Count, len(out))
			}
			if l.SHA256 != "" {
				sum := sha256.Sum256(data[:at])
				if got := hex.EncodeToString(sum[:]); got != l.SHA256 {
					return nil, bad(n, "the end line's sha256 %s does not match the file's %s (the file was altered)", l.SHA256, got)
				}
			}
			ended = true
		default:
			return nil, bad(n, "unknown kind %q", l.Kind)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read records %s: %w", path, err)
	}
	if !ended {
		return nil, bad(n, "no end line (the file is truncated after %d runs)", len(out))
	}
	return out, nil
}
