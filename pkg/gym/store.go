package gym

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sync"
	"sync/atomic"
)

// StateSchemaVersion is the manifest's schema_version.
const StateSchemaVersion = 1

// beforePublish, when set (by tests only), runs in a write just before it
// takes the stop's lock to publish, so a test can hold a write there or
// fail it as a full disk would.
var beforePublish atomic.Pointer[func() error]

// ManifestName is the file that publishes a participant's records.
const ManifestName = "manifest.json"

// recordsFilePattern is the records file name a manifest may carry: named
// after its digest, or the one fixed name checkpoints used before that.
var recordsFilePattern = regexp.MustCompile(`^records(-[0-9a-f]{64})?\.jsonl$`)

// manifestFields are the fields the store owns; extras may not reuse them.
var manifestFields = []string{"schema_version", "kind", "instance", "checkpoint_id", "records_file", "records_sha256", "record_count"}

// Manifest publishes one participant's records of one checkpoint (Gym's
// manifest.json). Extra holds the participant's own fields, kept beside
// the others at the top level and read back on restore.
type Manifest struct {
	SchemaVersion int
	Kind          string
	Instance      string
	CheckpointID  string
	RecordsFile   string
	RecordsSHA256 string
	RecordCount   int
	Extra         map[string]any
}

func (m Manifest) fields() map[string]any {
	f := make(map[string]any, len(m.Extra)+len(manifestFields))
	for k, v := range m.Extra {
		f[k] = v
	}
	f["schema_version"] = m.SchemaVersion
	f["kind"] = m.Kind
	f["instance"] = m.Instance
	f["checkpoint_id"] = m.CheckpointID
	f["records_file"] = m.RecordsFile
	f["records_sha256"] = m.RecordsSHA256
	f["record_count"] = m.RecordCount
	return f
}

// MarshalJSON writes the manifest as one flat object.
func (m Manifest) MarshalJSON() ([]byte, error) { return json.Marshal(m.fields()) }

// encode is the manifest file's bytes: keys sorted, one-space indent, no
// trailing newline and no HTML escaping, which for ASCII content is what
// Gym's json.dumps(sort_keys=True, indent=1) writes.
func (m Manifest) encode() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(m.fields()); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// ParticipantDir is <checkpointDir>/gym/<kind>/<instance>, after checking
// that kind and instance are safe path components (NamePattern).
func ParticipantDir(checkpointDir, kind, instance string) (string, error) {
	for _, part := range [][2]string{{"kind", kind}, {"instance", instance}} {
		if !NamePattern.MatchString(part[1]) {
			return "", Refuse(ErrCheckpointState, "participant %s %q is not a safe path component", part[0], part[1])
		}
	}
	return filepath.Join(checkpointDir, "gym", kind, instance), nil
}

// WriteStop lets a resume stop a checkpoint's write. Once Stop has
// returned, the write never publishes a manifest. The writer checks it
// before each record without waiting, and again under the lock while it
// publishes, so Stop waits only for a publication already under way, never
// for the rest of the write. The zero value is ready to use.
type WriteStop struct {
	mu      sync.Mutex
	stopped atomic.Bool
}

// Stop stops the write, waiting for a publication in progress to finish.
func (s *WriteStop) Stop() {
	s.mu.Lock()
	s.stopped.Store(true)
	s.mu.Unlock()
}

func (s *WriteStop) check(checkpointID string) error {
	if s.stopped.Load() {
		return Refuse(ErrCheckpointState, "checkpoint %q was resumed before its write finished", checkpointID)
	}
	return nil
}

// WriteState writes records and then the manifest that publishes them,
// manifest last: the records go to a temporary file one line at a time,
// hashed as they go, fsynced, and renamed after their digest; the manifest
// is then created from a fsynced temporary file by a hard link, which never
// replaces a name, and the folder is fsynced. So a folder with a manifest
// never changes: writing the same checkpoint again returns the manifest
// already there, and writing a different one fails, even when two writers
// race. stop (may be nil) aborts before the next record and before
// publishing. Every failure is an ErrCheckpointState naming the path.
func WriteState(checkpointDir, kind, instance, checkpointID string, records []Record, extra map[string]any, stop *WriteStop) (Manifest, error) {
	if stop == nil {
		stop = &WriteStop{}
	}
	for _, name := range manifestFields {
		if _, ok := extra[name]; ok {
			return Manifest{}, Refuse(ErrCheckpointState, "participant manifest field %q is reserved", name)
		}
	}
	dir, err := ParticipantDir(checkpointDir, kind, instance)
	if err != nil {
		return Manifest{}, err
	}
	m, err := writeState(dir, kind, instance, checkpointID, records, extra, stop)
	if err != nil {
		return Manifest{}, StorageRefusal(err, "cannot write checkpoint state under %s", checkpointDir)
	}
	return m, nil
}

func writeState(dir, kind, instance, checkpointID string, records []Record, extra map[string]any, stop *WriteStop) (Manifest, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Manifest{}, err
	}
	tmp, err := os.CreateTemp(dir, ".records.jsonl.")
	if err != nil {
		return Manifest{}, err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	digest := sha256.New()
	out := bufio.NewWriter(io.MultiWriter(tmp, digest))
	for _, r := range records {
		if err := stop.check(checkpointID); err != nil {
			tmp.Close()
			return Manifest{}, err
		}
		if len(r.JSON) == 0 || bytes.IndexByte(r.JSON, '\n') >= 0 {
			tmp.Close()
			return Manifest{}, Refuse(ErrCheckpointState, "checkpoint record of episode %q is not one line of JSON", r.EpisodeID.CaptureKey())
		}
		out.Write(r.JSON)
		out.WriteByte('\n')
	}
	err = out.Flush()
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Manifest{}, err
	}
	sum := hex.EncodeToString(digest.Sum(nil))
	m := Manifest{
		SchemaVersion: StateSchemaVersion, Kind: kind, Instance: instance, CheckpointID: checkpointID,
		RecordsFile: "records-" + sum + ".jsonl", RecordsSHA256: sum, RecordCount: len(records), Extra: extra,
	}
	payload, err := m.encode()
	if err != nil {
		return Manifest{}, Refuse(ErrCheckpointState, "participant manifest extra is not JSON: %v", err)
	}
	manifestPath := filepath.Join(dir, ManifestName)
	created, err := publish(stop, checkpointID, tmp.Name(), filepath.Join(dir, m.RecordsFile), manifestPath, payload)
	if err != nil {
		return Manifest{}, err
	}
	if created {
		return m, syncDir(dir)
	}
	existing, err := loadManifest(manifestPath)
	if err != nil {
		return Manifest{}, err
	}
	if !sameManifest(existing, m) {
		if rf, _ := existing["records_file"].(string); rf != m.RecordsFile {
			os.Remove(filepath.Join(dir, m.RecordsFile))
		}
		return Manifest{}, Refuse(ErrCheckpointState, "%s already holds a different commit", manifestPath)
	}
	return manifestFrom(existing), nil
}

// publish renames the records file into place and creates the manifest,
// under the stop's lock; it reports whether this call created the manifest.
func publish(stop *WriteStop, checkpointID, tmpRecords, records, manifestPath string, payload []byte) (bool, error) {
	if hook := beforePublish.Load(); hook != nil {
		if err := (*hook)(); err != nil {
			return false, err
		}
	}
	stop.mu.Lock()
	defer stop.mu.Unlock()
	if err := stop.check(checkpointID); err != nil {
		return false, err
	}
	// Same name, same content: replacing a file another writer of the same
	// records renamed changes nothing.
	if err := os.Rename(tmpRecords, records); err != nil {
		return false, err
	}
	return createOnce(manifestPath, payload)
}

// createOnce writes path atomically unless it exists, and reports whether
// this call created it: a fsynced temporary file, then a hard link.
func createOnce(path string, payload []byte) (bool, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(payload)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// loadManifest reads a manifest file as a generic object.
func loadManifest(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, Refuse(ErrCheckpointState, "%s is not JSON: %v", path, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, Refuse(ErrCheckpointState, "%s is not a manifest", path)
	}
	return m, nil
}

// sameManifest compares a manifest read from disk with one about to be
// written, as JSON values (so 1 and 1.0 are equal, as in Python).
func sameManifest(existing map[string]any, m Manifest) bool {
	data, err := json.Marshal(m.fields())
	if err != nil {
		return false
	}
	var mine any
	if err := json.Unmarshal(data, &mine); err != nil {
		return false
	}
	return reflect.DeepEqual(existing, mine)
}

// manifestFrom builds a Manifest from a checked generic object.
func manifestFrom(f map[string]any) Manifest {
	m := Manifest{Extra: map[string]any{}}
	for k, v := range f {
		switch k {
		case "schema_version":
			m.SchemaVersion = asInt(v)
		case "kind":
			m.Kind, _ = v.(string)
		case "instance":
			m.Instance, _ = v.(string)
		case "checkpoint_id":
			m.CheckpointID, _ = v.(string)
		case "records_file":
			m.RecordsFile, _ = v.(string)
		case "records_sha256":
			m.RecordsSHA256, _ = v.(string)
		case "record_count":
			m.RecordCount = asInt(v)
		default:
			m.Extra[k] = v
		}
	}
	if len(m.Extra) == 0 {
		m.Extra = nil
	}
	return m
}

func asInt(v any) int {
	f, _ := v.(float64)
	return int(f)
}

// isInt reports whether v (a decoded JSON value) is the number n.
func isInt(v any, n int) bool {
	f, ok := v.(float64)
	return ok && f == float64(n)
}

// ManifestCheckpointID is the checkpoint id the manifest in a participant
// folder names: whether a checkpoint a participant wrote is still on disk.
// It reads the manifest only. No manifest (the folder, or the whole
// checkpoint, deleted; or a write that never published) is an error
// wrapping fs.ErrNotExist; an unreadable or malformed one is another error.
func ManifestCheckpointID(participantDir string) (string, error) {
	path := filepath.Join(participantDir, ManifestName)
	f, err := loadManifest(path)
	if err != nil {
		return "", err
	}
	id, ok := f["checkpoint_id"].(string)
	if !ok {
		return "", Refuse(ErrCheckpointState, "%s names no checkpoint", path)
	}
	return id, nil
}

// ReadState reads and verifies a participant's records in one streaming
// pass. It checks the manifest (schema, kind, instance, a checkpoint id,
// the records file name), then hands each line to each (which may be nil)
// as it reads, and checks the digest and the count over the whole file at
// the end, so a caller must not use what it kept unless ReadState returns
// nil. each sees every line, kept or not; its error ends the read. Every
// failure is an ErrCheckpointState naming the file.
func ReadState(checkpointDir, kind, instance string, each func(Record) error) (Manifest, error) {
	dir, err := ParticipantDir(checkpointDir, kind, instance)
	if err != nil {
		return Manifest{}, err
	}
	m, err := readState(dir, kind, instance, each)
	if err != nil {
		return Manifest{}, StorageRefusal(err, "cannot read checkpoint state from %s", dir)
	}
	return m, nil
}

func readState(dir, kind, instance string, each func(Record) error) (Manifest, error) {
	manifestPath := filepath.Join(dir, ManifestName)
	if _, err := os.Stat(manifestPath); errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, Refuse(ErrCheckpointState, "missing manifest %s", manifestPath)
	}
	f, err := loadManifest(manifestPath)
	if err != nil {
		return Manifest{}, err
	}
	if !isInt(f["schema_version"], StateSchemaVersion) {
		return Manifest{}, Refuse(ErrCheckpointState, "%s has unsupported schema %v", manifestPath, f["schema_version"])
	}
	if f["kind"] != kind || f["instance"] != instance {
		return Manifest{}, Refuse(ErrCheckpointState, "%s belongs to %v/%v", manifestPath, f["kind"], f["instance"])
	}
	if _, ok := f["checkpoint_id"].(string); !ok {
		return Manifest{}, Refuse(ErrCheckpointState, "%s names no checkpoint", manifestPath)
	}
	recordsFile, _ := f["records_file"].(string)
	if !recordsFilePattern.MatchString(recordsFile) {
		return Manifest{}, Refuse(ErrCheckpointState, "%s names an invalid records file %v", manifestPath, f["records_file"])
	}
	recordsPath := filepath.Join(dir, recordsFile)
	file, err := os.Open(recordsPath)
	if err != nil {
		return Manifest{}, err
	}
	defer file.Close()
	digest := sha256.New()
	in := bufio.NewReader(file)
	count := 0
	for {
		line, err := in.ReadBytes('\n')
		if len(line) > 0 {
			digest.Write(line)
			count++
			r, perr := ParseRecord(line)
			if perr != nil {
				return Manifest{}, Refuse(ErrCheckpointState, "%s line %d: %v", recordsPath, count, perr)
			}
			if each != nil {
				if err := each(r); err != nil {
					return Manifest{}, err
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return Manifest{}, err
		}
	}
	if hex.EncodeToString(digest.Sum(nil)) != f["records_sha256"] {
		return Manifest{}, Refuse(ErrCheckpointState, "%s does not match its manifest digest", recordsPath)
	}
	if !isInt(f["record_count"], count) {
		return Manifest{}, Refuse(ErrCheckpointState, "%s expects %v records, found %d", manifestPath, f["record_count"], count)
	}
	return manifestFrom(f), nil
}
