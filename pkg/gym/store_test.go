package gym

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeFixture(t *testing.T, dir, id string, records ...Record) Manifest {
	t.Helper()
	m, err := WriteState(dir, "agent", "inst", id, records, map[string]any{"format": "x<y"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readAll(dir string) (Manifest, []Record, error) {
	var got []Record
	m, err := ReadState(dir, "agent", "inst", func(r Record) error { got = append(got, r); return nil })
	return m, got, err
}

// The layout, file names and bytes of a write: records-<sha256>.jsonl
// holding one compact line per record, and a manifest with sorted keys,
// one-space indent and the participant's extras, as store.py e7e449e
// writes them; a verified read gives back the same records and manifest.
func TestWriteStateLayoutAndRoundTrip(t *testing.T) {
	dir := t.TempDir()
	records := []Record{rec(t, "r", 0, 1), rec(t, "s", 2, 7)}
	m := writeFixture(t, dir, "c1", records...)
	pdir := filepath.Join(dir, "gym", "agent", "inst")
	data, err := os.ReadFile(filepath.Join(pdir, m.RecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if m.RecordsSHA256 != hex.EncodeToString(sum[:]) || m.RecordsFile != "records-"+m.RecordsSHA256+".jsonl" || m.RecordCount != 2 {
		t.Fatalf("manifest %+v does not describe %q", m, data)
	}
	wantLines := `{"episode":{"step":1},"episode_id":{"rollout_id":"r","attempt":0}}` + "\n" +
		`{"episode":{"step":7},"episode_id":{"rollout_id":"s","attempt":2}}` + "\n"
	if string(data) != wantLines {
		t.Fatalf("records file:\n%s\nwant:\n%s", data, wantLines)
	}
	manifest, _ := os.ReadFile(filepath.Join(pdir, ManifestName))
	want := "{\n \"checkpoint_id\": \"c1\",\n \"format\": \"x<y\",\n \"instance\": \"inst\",\n \"kind\": \"agent\",\n \"record_count\": 2,\n \"records_file\": \"" + m.RecordsFile +
		"\",\n \"records_sha256\": \"" + m.RecordsSHA256 + "\",\n \"schema_version\": 1\n}"
	if string(manifest) != want {
		t.Fatalf("manifest file:\n%s\nwant:\n%s", manifest, want)
	}
	entries, _ := os.ReadDir(pdir)
	if len(entries) != 2 {
		t.Fatalf("folder holds %v, want the records file and the manifest only", entries)
	}
	got, back, err := readAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.CheckpointID != "c1" || got.Extra["format"] != "x<y" || len(back) != 2 || back[1].EpisodeID != (EpisodeID{"s", 2}) || string(back[0].JSON) != string(records[0].JSON) {
		t.Fatalf("read back %+v %v", got, back)
	}
}

// Committing the same checkpoint again returns the manifest already there;
// a different one into the same folder fails and removes the records file
// it wrote; the first commit stays readable.
func TestWriteStateIsCreateOnly(t *testing.T) {
	dir := t.TempDir()
	first := writeFixture(t, dir, "c1", rec(t, "r", 0, 1))
	again := writeFixture(t, dir, "c1", rec(t, "r", 0, 1))
	if fmtJSON(t, again) != fmtJSON(t, first) {
		t.Fatalf("same commit again = %+v, want %+v", again, first)
	}
	_, err := WriteState(dir, "agent", "inst", "c2", []Record{rec(t, "q", 0, 9)}, nil, nil)
	wantCode(t, err, CodeCheckpointState)
	if !strings.Contains(err.Error(), "already holds a different commit") || !strings.Contains(err.Error(), ManifestName) {
		t.Fatalf("error does not name the manifest: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "gym", "agent", "inst"))
	if len(entries) != 2 {
		t.Fatalf("folder holds %v after a refused commit", entries)
	}
	if m, _, err := readAll(dir); err != nil || m.CheckpointID != "c1" {
		t.Fatalf("first commit after a refused one: %+v %v", m, err)
	}
}

func fmtJSON(t *testing.T, v any) string {
	t.Helper()
	return string(must(json.Marshal(v)))
}

// A stopped write publishes nothing and leaves no file (store.py WriteStop).
func TestWriteStateStopped(t *testing.T) {
	dir := t.TempDir()
	stop := &WriteStop{}
	stop.Stop()
	_, err := WriteState(dir, "agent", "inst", "c1", []Record{rec(t, "r", 0, 1)}, nil, stop)
	wantCode(t, err, CodeCheckpointState)
	_, err = WriteState(dir, "agent", "inst", "c1", nil, nil, stop)
	wantCode(t, err, CodeCheckpointState)
	entries, _ := os.ReadDir(filepath.Join(dir, "gym", "agent", "inst"))
	if len(entries) != 0 {
		t.Fatalf("a stopped write left %v", entries)
	}
}

// Names and extras the store refuses.
func TestWriteStateRefusesUnsafeInput(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		kind, instance string
		extra          map[string]any
		records        []Record
	}{
		{"../x", "inst", nil, nil},
		{"agent", ".hidden", nil, nil},
		{"agent", "a/b", nil, nil},
		{"agent", "inst", map[string]any{"record_count": 5}, nil},
		{"agent", "inst", nil, []Record{{EpisodeID: EpisodeID{"r", 0}, JSON: json.RawMessage("{\n}")}}},
	} {
		_, err := WriteState(dir, tc.kind, tc.instance, "c1", tc.records, tc.extra, nil)
		wantCode(t, err, CodeCheckpointState)
	}
}

// The crash cases and the checks of a verified read (store.py _read): a
// folder with only a temporary file (a crash before the manifest), a cut
// records file, a wrong digest, a wrong count, another participant's
// manifest, a bad schema, a bad records file name, a manifest that is not
// JSON, a record that is not JSON. Each is invalid_checkpoint_state and
// its error names the file.
func TestReadStateRefusesDamage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, pdir string, m Manifest)
		names  string
	}{
		{"temp file only", func(t *testing.T, pdir string, m Manifest) {
			os.Remove(filepath.Join(pdir, ManifestName))
			os.Rename(filepath.Join(pdir, m.RecordsFile), filepath.Join(pdir, ".records.jsonl.123"))
		}, "missing manifest"},
		{"cut records file", func(t *testing.T, pdir string, m Manifest) {
			path := filepath.Join(pdir, m.RecordsFile)
			data, _ := os.ReadFile(path)
			os.WriteFile(path, data[:len(data)-10], 0o644)
		}, m0RecordsFile},
		{"cut at a line end", func(t *testing.T, pdir string, m Manifest) {
			path := filepath.Join(pdir, m.RecordsFile)
			data, _ := os.ReadFile(path)
			os.WriteFile(path, data[:strings.IndexByte(string(data), '\n')+1], 0o644)
		}, "does not match its manifest digest"},
		{"records file gone", func(t *testing.T, pdir string, m Manifest) {
			os.Remove(filepath.Join(pdir, m.RecordsFile))
		}, m0RecordsFile},
		{"bad digest", func(t *testing.T, pdir string, m Manifest) {
			editManifest(t, pdir, "records_sha256", strings.Repeat("0", 64))
		}, "does not match its manifest digest"},
		{"bad count", func(t *testing.T, pdir string, m Manifest) {
			editManifest(t, pdir, "record_count", 3)
		}, "expects 3 records, found 2"},
		{"another participant", func(t *testing.T, pdir string, m Manifest) {
			editManifest(t, pdir, "instance", "other")
		}, "belongs to agent/other"},
		{"schema 2", func(t *testing.T, pdir string, m Manifest) {
			editManifest(t, pdir, "schema_version", 2)
		}, "unsupported schema 2"},
		{"no checkpoint", func(t *testing.T, pdir string, m Manifest) {
			editManifest(t, pdir, "checkpoint_id", nil)
		}, "names no checkpoint"},
		{"records file outside", func(t *testing.T, pdir string, m Manifest) {
			editManifest(t, pdir, "records_file", "../records.jsonl")
		}, "invalid records file"},
		{"manifest not JSON", func(t *testing.T, pdir string, m Manifest) {
			os.Remove(filepath.Join(pdir, ManifestName))
			os.WriteFile(filepath.Join(pdir, ManifestName), []byte("{"), 0o644)
		}, "is not JSON"},
		{"manifest not an object", func(t *testing.T, pdir string, m Manifest) {
			os.Remove(filepath.Join(pdir, ManifestName))
			os.WriteFile(filepath.Join(pdir, ManifestName), []byte("[]"), 0o644)
		}, "is not a manifest"},
		{"record not JSON", func(t *testing.T, pdir string, m Manifest) {
			path := filepath.Join(pdir, m.RecordsFile)
			os.WriteFile(path, []byte("{\"episode_id\":{\"rollout_id\":\"r\"}}\nnot json\n"), 0o644)
		}, "line 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			m := writeFixture(t, dir, "c1", rec(t, "r", 0, 1), rec(t, "s", 0, 2))
			pdir := filepath.Join(dir, "gym", "agent", "inst")
			tc.damage(t, pdir, m)
			_, _, err := readAll(dir)
			wantCode(t, err, CodeCheckpointState)
			want := tc.names
			if want == m0RecordsFile {
				want = filepath.Join(pdir, m.RecordsFile)
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not say %q", err, want)
			}
		})
	}
}

// m0RecordsFile stands for "the records file's path" in the cases above.
const m0RecordsFile = "<records file>"

func editManifest(t *testing.T, pdir, field string, value any) {
	t.Helper()
	path := filepath.Join(pdir, ManifestName)
	var m map[string]any
	if err := json.Unmarshal(must(os.ReadFile(path)), &m); err != nil {
		t.Fatal(err)
	}
	m[field] = value
	os.Remove(path) // the manifest is a hard link; write a new file
	if err := os.WriteFile(path, must(json.Marshal(m)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A records file named records.jsonl (checkpoints written before the
// digest name) is still read, and a last line without a newline counts.
func TestReadStateLegacyNameAndLastLine(t *testing.T) {
	dir := t.TempDir()
	pdir := filepath.Join(dir, "gym", "agent", "inst")
	os.MkdirAll(pdir, 0o755)
	body := []byte(`{"episode_id":{"rollout_id":"r"}}` + "\n" + `{"episode_id":{"rollout_id":"s","attempt":1}}`)
	os.WriteFile(filepath.Join(pdir, "records.jsonl"), body, 0o644)
	sum := sha256.Sum256(body)
	m := map[string]any{"schema_version": 1, "kind": "agent", "instance": "inst", "checkpoint_id": "old", "records_file": "records.jsonl", "records_sha256": hex.EncodeToString(sum[:]), "record_count": 2}
	os.WriteFile(filepath.Join(pdir, ManifestName), must(json.Marshal(m)), 0o644)
	got, records, err := readAll(dir)
	if err != nil || got.CheckpointID != "old" || len(records) != 2 {
		t.Fatalf("legacy read = %+v %v %v", got, records, err)
	}
	keys := []string{records[0].EpisodeID.CaptureKey(), records[1].EpisodeID.CaptureKey()}
	if !slices.Equal(keys, []string{"r", "s-a1"}) {
		t.Fatalf("keys %v", keys)
	}
}
