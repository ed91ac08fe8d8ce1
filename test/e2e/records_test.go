package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ngharness/ngharness/pkg/gym"
)

// recordEdit changes one decoded record (a JSON object) before it is
// written back; words are what the refusal must say beside the episode.
type recordEdit struct {
	name  string
	edit  func(m map[string]any)
	words []string
}

// TestRestoreValidatesRecordsAsGymDoes: a restore from a checkpoint whose
// record breaks Gym's model of it (AgentSessionRecord and
// ResourcesSessionRecord, extra="forbid": an unknown field, a name spelled
// another way, a required field missing or null) or what it nests (the
// agent's session, the owner's state: this project's own, read the same
// way) is refused by that participant with 422 invalid_checkpoint_state
// naming the episode and the field, as Gym's participants refuse it, and
// installs nothing: the driver and the owner stay idle with no session,
// and the owner makes no sandbox. The records are the real ones a commit
// of a running rollout wrote, each changed in one place; unchanged, both
// restore, and so does the owner's record with Gym's optional owner field.
func TestRestoreValidatesRecordsAsGymDoes(t *testing.T) {
	const steps = 6
	e := newEnv(t, options{steps: steps})
	id := e.rollout("rec")
	ch := e.startRun("/run", id, e.body(id, steps, e.opts.stepS))
	e.waitStepped(id)
	ck := e.prepareCommit(e.prefix + "-ck1")
	if _, ok := ck.owned[id]; !ok || !ck.paused[id] {
		t.Fatalf("the checkpoint did not take the run: agent records %v, owner records %v", ck.records, ck.owned)
	}
	e.resumeAll(ck.id)
	checkOneLaunch(t, e, id, await(t, ch).result(t), steps, 1)

	ownDir, err := gym.ParticipantDir(ck.dir, gym.KindResources, ownerInstance)
	if err != nil {
		t.Fatal(err)
	}
	agent := []recordEdit{
		{"unknown field", func(m map[string]any) { m["extra"] = 1 }, []string{`unknown field "extra"`}},
		{"name in another case", func(m map[string]any) { m["Session_Key"] = m["session_key"]; delete(m, "session_key") }, []string{`unknown field "Session_Key"`}},
		{"unknown field in the session", func(m map[string]any) { m["session"].(map[string]any)["x"] = true }, []string{`session: unknown field "x"`}},
		{"null session key", func(m map[string]any) { m["session_key"] = nil }, []string{"session_key must not be null"}},
		{"no session", func(m map[string]any) { delete(m, "session") }, []string{"session is required"}},
		{"a native boundary", func(m map[string]any) { m["boundary"] = map[string]any{"turn": 1} }, []string{"boundary must be null"}},
	}
	owner := []recordEdit{
		{"unknown field", func(m map[string]any) { m["extra"] = 1 }, []string{`unknown field "extra"`}},
		{"name in another case", func(m map[string]any) { m["SESSION_ID"] = m["session_id"]; delete(m, "session_id") }, []string{`unknown field "SESSION_ID"`}},
		{"unknown field in the state", func(m map[string]any) { m["state"].(map[string]any)["x"] = true }, []string{`state: unknown field "x"`}},
		{"null state", func(m map[string]any) { m["state"] = nil }, []string{"state must be an object, not null"}},
		{"no state", func(m map[string]any) { delete(m, "state") }, []string{"state is required"}},
		{"owner not a string", func(m map[string]any) { m["owner"] = 5 }, []string{"owner"}},
	}
	sandboxes := func() []string {
		ents, _ := os.ReadDir(filepath.Join(e.base, "sandboxes"))
		var out []string
		for _, ent := range ents {
			out = append(out, ent.Name())
		}
		return out
	}
	for _, side := range []struct {
		who   string
		c     *controller
		kind  string
		inst  string
		pdir  string
		edits []recordEdit
	}{
		{"driver", e.ctl, gym.KindAgent, driverName, participantDir(ck.dir), agent},
		{"owner", e.own, gym.KindResources, ownerInstance, ownDir, owner},
	} {
		line := onlyRecord(t, side.pdir)
		for i, ed := range side.edits {
			var m map[string]any
			if err := json.Unmarshal(line, &m); err != nil {
				t.Fatal(err)
			}
			ed.edit(m)
			dir := filepath.Join(e.dir, "edited", side.who, string(rune('a'+i)))
			writeRaw(t, dir, side.kind, side.inst, ck.id, m)
			before := sandboxes()
			r := side.c.call(t, "restore", restoreBody(e.prefix+"-bad-"+side.who+string(rune('a'+i)), dir, episodes(id)))
			wantRefused(t, r, http.StatusUnprocessableEntity, gym.CodeCheckpointState, append([]string{id}, ed.words...)...)
			if s := side.c.status(t); s.Phase != gym.PhaseIdle || s.Report.Counts["sessions"] != 0 {
				t.Errorf("%s, %s: after the refused restore the status is %+v, want idle with no session", side.who, ed.name, s)
			}
			if after := sandboxes(); !slices.Equal(before, after) {
				t.Errorf("%s, %s: the refused restore changed the sandboxes from %v to %v", side.who, ed.name, before, after)
			}
		}
	}
	// Unchanged, both restore; the owner's record with Gym's owner field too.
	var m map[string]any
	if err := json.Unmarshal(onlyRecord(t, ownDir), &m); err != nil {
		t.Fatal(err)
	}
	m["owner"] = "worker-1"
	withOwner := filepath.Join(e.dir, "edited", "owner", "with-owner")
	writeRaw(t, withOwner, gym.KindResources, ownerInstance, ck.id, m)
	restoreID := e.prefix + "-good"
	var rr gym.RestoreReply
	e.ctl.must(t, "restore", restoreBody(restoreID, ck.dir, episodes(id)), &rr)
	e.own.must(t, "restore", restoreBody(restoreID, withOwner, episodes(id)), &rr)
	if !slices.Equal(rr.Restored, []string{id + "-a1"}) {
		t.Errorf("the owner's restore answered %+v, want %s-a1 restored", rr, id)
	}
	e.resumeAll(restoreID)
}

// onlyRecord is the one record line a participant folder holds.
func onlyRecord(t *testing.T, pdir string) []byte {
	t.Helper()
	m := readManifest(t, pdir)
	data, err := os.ReadFile(filepath.Join(pdir, m.RecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) != 1 {
		t.Fatalf("%s holds %d records, want 1", pdir, len(lines))
	}
	return lines[0]
}

// writeRaw stores one record, as given, under dir through pkg/gym's store.
func writeRaw(t *testing.T, dir, kind, instance, checkpointID string, rec map[string]any) {
	t.Helper()
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	r, err := gym.ParseRecord(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gym.WriteState(dir, kind, instance, checkpointID, []gym.Record{r}, nil, nil); err != nil {
		t.Fatal(err)
	}
}
