package gyme2e

// A checkpoint as Gym's checkpointing collection takes one
// (collection.py _commit), and each participant's folder checked on disk
// as Gym's store writes it (store.py e7e449e): exactly records-<sha256>.jsonl
// and manifest.json under <checkpoint_dir>/gym/<kind>/<instance>, the
// records file's digest and line count those of the manifest, the manifest
// the bytes json.dumps(manifest, sort_keys=True, indent=1) gives.

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/gym"
)

// ckpt is one committed checkpoint.
type ckpt struct {
	id, dir string
	prep    prepareResult
	scope   []gym.EpisodeID
	commits map[string]commitReply
	records map[string][]storedRecord // by participant entry name
}

// storedRecord is one line of a records file.
type storedRecord struct {
	Episode gym.EpisodeID
	Fields  map[string]json.RawMessage
}

// checkpoint prepares every participant (which must prepare), commits the
// episodes in flight that no participant reported as a restart, and checks
// every participant's folder on disk. It does not resume.
func (w *world) checkpoint(id string, inFlight []gym.EpisodeID, stop bool) ckpt {
	w.t.Helper()
	ck := ckpt{id: id, dir: w.checkpointDir(id), records: map[string][]storedRecord{}}
	deadline := deadlineIn(waitLimit)
	ck.prep = w.coord.prepare(id, deadline)
	if !ck.prep.prepared {
		w.t.Fatalf("checkpoint %s did not prepare: %+v", id, ck.prep.replies)
	}
	for _, m := range w.coord.members {
		if st := w.coord.status(m); st.Phase != gym.PhasePrepared || deref(st.CheckpointID) != id {
			w.t.Fatalf("%s after prepare: phase %s checkpoint %v, want prepared %s", m.Name, st.Phase, deref(st.CheckpointID), id)
		}
	}
	ck.scope = ck.prep.continued(inFlight)
	if ck.scope == nil {
		ck.scope = []gym.EpisodeID{}
	}
	ck.commits = w.coord.commit(id, ck.dir, ck.scope, stop, deadline)
	for _, m := range w.coord.members {
		ck.records[m.Name] = checkStore(w.t, ck.dir, m, ck.commits[m.Name])
		if st := w.coord.status(m); st.Phase != gym.PhaseCommitted {
			w.t.Fatalf("%s after commit: phase %s, want committed", m.Name, st.Phase)
		}
	}
	return ck
}

// recordsOf lists the capture keys of a participant's records.
func (ck ckpt) keys(name string) []string {
	var out []string
	for _, r := range ck.records[name] {
		out = append(out, r.Episode.CaptureKey())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// checkStore checks participant m's folder of a checkpoint against its
// commit reply, byte for byte, and returns its records.
func checkStore(t *testing.T, checkpointDir string, m member, cr commitReply) []storedRecord {
	t.Helper()
	dir := filepath.Join(checkpointDir, "gym", m.Kind, m.Instance)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%s: the participant folder: %v", m.Name, err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	recordsFile, _ := cr.Manifest["records_file"].(string)
	if want := []string{gym.ManifestName, recordsFile}; !slices.Equal(names, want) {
		t.Errorf("%s: %s holds %q, want exactly %q", m.Name, dir, names, want)
	}
	manifest, err := os.ReadFile(filepath.Join(dir, gym.ManifestName))
	if err != nil {
		t.Fatalf("%s: %v", m.Name, err)
	}
	if want := pythonManifest(t, cr.Manifest); !bytes.Equal(manifest, want) {
		t.Errorf("%s: manifest.json is\n%s\nwant the commit reply's manifest as json.dumps(sort_keys=True, indent=1) writes it:\n%s", m.Name, manifest, want)
	}
	data, err := os.ReadFile(filepath.Join(dir, recordsFile))
	if err != nil {
		t.Fatalf("%s: the records file: %v", m.Name, err)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != cr.Manifest["records_sha256"] {
		t.Errorf("%s: %s has sha256 %x, the manifest says %v", m.Name, recordsFile, sum, cr.Manifest["records_sha256"])
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		t.Errorf("%s: %s does not end with a newline", m.Name, recordsFile)
	}
	var records []storedRecord
	var keys []string
	for i, line := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		if len(data) == 0 {
			break
		}
		var f map[string]json.RawMessage
		if err := json.Unmarshal(line, &f); err != nil {
			t.Fatalf("%s: %s line %d is not a JSON object: %v", m.Name, recordsFile, i+1, err)
		}
		var id gym.EpisodeID
		if err := id.UnmarshalJSON(f["episode_id"]); err != nil {
			t.Fatalf("%s: %s line %d: episode_id %s: %v", m.Name, recordsFile, i+1, f["episode_id"], err)
		}
		// Gym's AgentSessionRecord and ResourcesSessionRecord.
		recordShape := map[string]shape{
			gym.KindAgent:     {"episode_id": wObject, "session_key": wString, "session": wObject},
			gym.KindResources: {"episode_id": wObject, "session_id": wString, "state": wObject},
		}[m.Kind]
		if _, err := checkShape(m.Name+" record "+id.CaptureKey(), line, recordShape, anyExtra); err != nil {
			t.Error(err)
		}
		records = append(records, storedRecord{Episode: id, Fields: f})
		keys = append(keys, id.CaptureKey())
	}
	if n, _ := cr.Manifest["record_count"].(float64); int(n) != len(records) {
		t.Errorf("%s: %s has %d lines, the manifest counts %v", m.Name, recordsFile, len(records), cr.Manifest["record_count"])
	}
	slices.Sort(keys)
	if keys = slices.Compact(keys); !slices.Equal(keys, cr.EpisodeIDs) && !(len(keys) == 0 && len(cr.EpisodeIDs) == 0) {
		t.Errorf("%s: the records hold episodes %q, the commit reply says %q", m.Name, keys, cr.EpisodeIDs)
	}
	// What Gym's own reader checks, through pkg/gym's port of it.
	if _, err := gym.ReadState(checkpointDir, m.Kind, m.Instance, nil); err != nil {
		t.Errorf("%s: Gym's read of the folder fails: %v", m.Name, err)
	}
	return records
}

// pythonManifest is json.dumps(manifest, sort_keys=True, indent=1) for a
// manifest of ASCII strings and integers: keys sorted, one space of
// indent, ": " and ",\n" between, no trailing newline.
func pythonManifest(t *testing.T, m map[string]any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(m); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// inScope reports whether key names an episode of scope.
func inScope(scope []gym.EpisodeID, key string) bool {
	for _, id := range scope {
		if id.CaptureKey() == key {
			return true
		}
	}
	return false
}

// episodes lists the attempts the rows post.
func episodes(rows ...row) []gym.EpisodeID {
	out := make([]gym.EpisodeID, len(rows))
	for i, r := range rows {
		out[i] = episode(r)
	}
	return out
}

// keysOf lists capture keys, sorted.
func keysOf(ids []gym.EpisodeID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.CaptureKey()
	}
	slices.Sort(out)
	return out
}

// ckID is a checkpoint id shaped as collection.py names them, with a tag.
func ckID(tag string) string {
	return "ckpt-" + time.Now().UTC().Format("20060102T150405") + "-" + tag
}

// restoreID is a restore's checkpoint id as collection.py names it.
func restoreID() string {
	var b [6]byte
	rand.Read(b[:])
	return "restore-" + hex.EncodeToString(b[:])
}
