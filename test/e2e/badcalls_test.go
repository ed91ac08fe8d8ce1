package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver"
)

// wantRefused checks a control reply is status with an error naming every
// one of words.
func wantRefused(t *testing.T, r ctlReply, status int, words ...string) {
	t.Helper()
	msg := r.errorText()
	if r.status != status {
		t.Errorf("%s, want %d", r, status)
		return
	}
	for _, w := range words {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: the error does not name %q", r, w)
		}
	}
}

// wantPhase checks /healthz reports phase.
func (e *env) wantPhase(phase string) {
	e.t.Helper()
	if h := e.health(); h.Phase != phase {
		e.t.Errorf("/healthz phase %q, want %q", h.Phase, phase)
	}
}

// TestBadCalls: control calls out of order answer 409 naming the call and
// the phase, and change nothing; a wrong or missing token answers 401 and
// changes nothing; a malformed body answers 400; a records file that is
// truncated or of an unknown version makes restore answer 422 naming the
// file and the line, installs nothing (the rollout's next run starts at
// seed, attempt 1) and leaves the file as it was. The participant works
// after each of them.
func TestBadCalls(t *testing.T) {
	const steps = 12
	e := newEnv(t, options{steps: steps})
	c := e.ctl

	// Out of order, in idle.
	e.wantPhase("idle")
	wantRefused(t, c.call(t, "commit", commitBody("x", filepath.Join(e.dir, "x"), nil, false)), http.StatusConflict, "commit", "idle")
	wantRefused(t, c.call(t, "resume", plainBody("x")), http.StatusConflict, "resume", "idle")
	e.wantPhase("idle")
	if _, err := os.Stat(filepath.Join(e.dir, "x")); err == nil {
		t.Errorf("a refused commit wrote its checkpoint_dir")
	}

	// Tokens: wrong, missing, another scheme. Nothing changes.
	for name, auth := range map[string]string{
		"wrong":   "Bearer not-the-token",
		"missing": "",
		"empty":   "Bearer ",
		"basic":   "Basic " + e.token,
		"suffix":  "Bearer " + e.token + "x",
	} {
		r := c.raw(t, "prepare", auth, plainBody("tok-"+name))
		wantRefused(t, r, http.StatusUnauthorized, "unauthorized")
		e.wantPhase("idle")
		r = e.own.raw(t, "commit", auth, commitBody("tok-"+name, filepath.Join(e.dir, "tok"), nil, false))
		if r.status != http.StatusUnauthorized {
			t.Errorf("owner %s with a %s token: %s, want 401", r.call, name, r)
		}
	}

	// Malformed bodies. (A field the driver does not know is ignored, not
	// refused: the framework may add fields to the control calls.)
	for name, body := range map[string]string{
		"not json":      `{"checkpoint_id": `,
		"not an object": `["x"]`,
		"no id":         `{"deadline_ts":1}`,
		"wrong type":    `{"checkpoint_id":7}`,
	} {
		r := c.call(t, "prepare", body)
		if r.status != http.StatusBadRequest || r.errorText() == "" {
			t.Errorf("prepare with a body %s (%s): %s, want 400 with an error", name, body, r)
		}
	}
	e.wantPhase("idle")
	for name, body := range map[string]string{"not json": `{"rollout_id":`, "no rollout id": `{"task":"x"}`, "an array": `[1]`} {
		r := postRun(t.Context(), c.url, "/run", name, body)
		if r.err != nil || r.status != http.StatusBadRequest {
			t.Errorf("POST /run with %s: %s, want 400", name, r)
		}
	}

	// A run, and a prepare whose deadline has passed while it runs: the
	// phase stays preparing.
	id := e.rollout("r0")
	ch := e.startRun("/run", id, e.body(id, steps, e.opts.stepS))
	e.waitStepped(id)
	// The same rollout while it is in flight: 409, and the first goes on.
	if r := postRun(t.Context(), c.url, "/run", id, e.body(id, steps, e.opts.stepS)); r.status != http.StatusConflict || !strings.Contains(string(r.body), id) {
		t.Errorf("a second POST /run of %s in flight: %s, want 409 naming it", id, r)
	}
	ckID := e.prefix + "-ck1"
	var prep prepared
	r := c.call(t, "prepare", map[string]any{"checkpoint_id": ckID, "deadline_ts": deadline(-time.Second)})
	if r.status != http.StatusOK {
		t.Fatalf("%s", r)
	}
	if err := json.Unmarshal(r.body, &prep); err != nil {
		t.Fatal(err)
	}
	if prep.Parked {
		// The run parked before the deadline was even looked at: the
		// phase is prepared, not preparing.
		t.Logf("the run parked at once; the calls in preparing are checked in prepared")
		e.wantPhase("prepared")
	} else {
		if len(prep.NotParked) != 1 || prep.NotParked[0] != id {
			t.Errorf("prepare past its deadline: not_parked %v, want [%s]", prep.NotParked, id)
		}
		e.wantPhase("preparing")
		emptyDir := filepath.Join(e.dir, "empty-ck")
		os.MkdirAll(emptyDir, 0o755)
		wantRefused(t, c.call(t, "restore", restoreBody(ckID, emptyDir, nil)), http.StatusConflict, "restore", "preparing")
		wantRefused(t, c.call(t, "commit", commitBody(ckID, filepath.Join(e.dir, "y"), nil, false)), http.StatusConflict, "commit", "preparing")
		wantRefused(t, c.call(t, "prepare", plainBody(e.prefix+"-other")), http.StatusConflict, "prepare", "preparing")
		e.wantPhase("preparing")
		// The same prepare again waits for the run to park.
		c.must(t, "prepare", plainBody(ckID), &prep)
		if !prep.Parked || len(prep.Records) != 1 {
			t.Fatalf("prepare again: %+v, want the run parked", prep)
		}
	}
	e.wantPhase("prepared")
	wantRefused(t, c.call(t, "prepare", plainBody(e.prefix+"-other")), http.StatusConflict, "prepare", "prepared")
	wantRefused(t, c.call(t, "restore", restoreBody(ckID, filepath.Join(e.dir, "empty-ck"), nil)), http.StatusConflict, "restore", "prepared")
	wantRefused(t, c.call(t, "commit", commitBody(e.prefix+"-other", filepath.Join(e.dir, "other"), nil, false)), http.StatusConflict, "commit", e.prefix+"-other")
	// A wrong or missing token in prepared changes nothing either: no
	// resume, no records written.
	wantRefused(t, c.raw(t, "resume", "Bearer nope", plainBody(ckID)), http.StatusUnauthorized, "unauthorized")
	wantRefused(t, c.raw(t, "commit", "", commitBody(ckID, filepath.Join(e.dir, "tok-commit"), nil, false)), http.StatusUnauthorized, "unauthorized")
	if _, err := os.Stat(filepath.Join(e.dir, "tok-commit")); err == nil {
		t.Errorf("an unauthorized commit wrote its checkpoint_dir")
	}
	e.wantPhase("prepared")

	ckDir := filepath.Join(e.dir, "checkpoints", ckID)
	// A commit that cannot write its records fails and commits nothing:
	// the phase stays prepared and a good commit follows.
	wantRefused(t, c.call(t, "commit", commitBody(ckID, "relative/ck", nil, false)), http.StatusBadRequest, "relative/ck")
	r = c.call(t, "commit", commitBody(ckID, "/dev/null/ck", nil, false))
	if r.status < 400 || !strings.Contains(r.errorText(), "/dev/null") {
		t.Errorf("commit into /dev/null/ck: %s, want an error naming it", r)
	}
	e.wantPhase("prepared")
	c.must(t, "commit", commitBody(ckID, ckDir, nil, false), nil)
	e.own.must(t, "commit", commitBody(ckID, ckDir, nil, false), nil)
	e.wantPhase("committed")
	wantRefused(t, c.call(t, "commit", commitBody(ckID, ckDir, nil, false)), http.StatusConflict, "commit", "committed")
	wantRefused(t, c.call(t, "restore", restoreBody(ckID, ckDir, nil)), http.StatusConflict, "restore", "committed")
	wantRefused(t, c.call(t, "prepare", plainBody(e.prefix+"-other")), http.StatusConflict, "prepare", "committed")
	e.wantPhase("committed")
	e.resume(ckID)
	// The participant still works: the run finishes, paused once.
	res := await(t, ch).result(t)
	checkOneLaunch(t, e, id, res, steps, 1)

	// Bad records files: copies of the committed one, each corrupted.
	good, err := os.ReadFile(filepath.Join(ckDir, "gym", "records-"+driverName+".jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(good), "\n")
	lines = lines[:len(lines)-1] // the empty string after the last newline
	if len(lines) != 3 {
		t.Fatalf("the records file has %d lines, want header, run, end:\n%s", len(lines), good)
	}
	bad := map[string]struct {
		data string
		line int
	}{
		// The end line is gone: the file ends after the run.
		"no-end-line": {strings.Join(lines[:2], ""), 3},
		// The last line is cut in the middle.
		"cut-last-line": {strings.Join(lines[:2], "") + lines[2][:len(lines[2])/2], 3},
		// The run's line is cut and nothing follows.
		"cut-run-line": {lines[0] + lines[1][:len(lines[1])-20], 2},
		// Every "v":1 made "v":9: the header is the first to say so.
		"version-9": {strings.ReplaceAll(string(good), `"v":1`, `"v":9`), 1},
		// Only the run's bookmark is of an unknown version.
		"bookmark-v9": {lines[0] + strings.Replace(lines[1], `"bookmark":{"v":1`, `"bookmark":{"v":9`, 1) + lines[2], 2},
	}
	for name, b := range bad {
		dir := filepath.Join(e.dir, "bad", name)
		path := filepath.Join(dir, "gym", "records-"+driverName+".jsonl")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(b.data), 0o644); err != nil {
			t.Fatal(err)
		}
		r := c.call(t, "restore", restoreBody(ckID, dir, nil))
		wantRefused(t, r, http.StatusUnprocessableEntity, path, fmt.Sprintf("line %d", b.line))
		if name == "version-9" || name == "bookmark-v9" {
			wantRefused(t, r, http.StatusUnprocessableEntity, "version 9")
		}
		e.wantPhase("idle")
		if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, []byte(b.data)) {
			t.Errorf("%s: restore changed the records file (%v)", name, err)
		}
		if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
			t.Errorf("%s: restore left files beside the records file: %v", name, ents)
		}
	}
	// A commit that died while writing its records left only the
	// temporary file: the restore names the missing file, never answers
	// 200 with nothing restored.
	died := filepath.Join(e.dir, "bad", "died-mid-write", "gym")
	os.MkdirAll(died, 0o755)
	os.WriteFile(filepath.Join(died, ".records-"+driverName+".jsonl.tmp-4242"), good[:len(good)/2], 0o644)
	wantRefused(t, c.call(t, "restore", restoreBody(ckID, filepath.Dir(died), nil)), http.StatusUnprocessableEntity,
		filepath.Join(died, "records-"+driverName+".jsonl"), "temporary")
	e.wantPhase("idle")
	// The good file under another checkpoint's id, and a checkpoint_dir
	// that does not exist.
	wantRefused(t, c.call(t, "restore", restoreBody(e.prefix+"-other", ckDir, nil)), http.StatusUnprocessableEntity, "line 1", e.prefix+"-other")
	wantRefused(t, c.call(t, "restore", restoreBody(ckID, filepath.Join(e.dir, "nowhere"), nil)), http.StatusUnprocessableEntity, filepath.Join(e.dir, "nowhere"))
	// The owner: a restore of a checkpoint it never snapshotted is the
	// caller's error, and changes nothing.
	if r := e.own.call(t, "restore", restoreBody(e.prefix+"-never", ckDir, nil)); r.status != http.StatusBadRequest && r.status != http.StatusNotFound {
		t.Errorf("%s, want 400 or 404", r)
	}
	e.wantPhase("idle")
	// Nothing was installed: the rollout's next run starts at seed, as
	// attempt 1, and is never relaunched.
	res = postRun(t.Context(), c.url, "/run", id, e.body(id, 3, 0.05)).result(t)
	checkOneLaunchFresh(t, id, res, 3)
	e.wantPhase("idle")
}

// checkOneLaunchFresh checks a run that started at seed as attempt 1.
func checkOneLaunchFresh(t *testing.T, id string, res result, steps int) {
	t.Helper()
	if res.Reward != 1 || len(res.Launches) != 1 || res.Response.FirstStep != 1 || res.Response.Steps != steps {
		t.Errorf("%s: %+v, want a fresh run: reward 1, one launch, steps 1..%d", id, res, steps)
		return
	}
	if l := res.Launches[0]; l.ID != driver.LaunchID(id, 1, 1) || l.Resumed || l.Reason != "first launch" {
		t.Errorf("%s: launch %+v, want %s, a first launch", id, l, driver.LaunchID(id, 1, 1))
	}
}

// TestClientGone: a client that goes away mid-run cancels it: the driver
// kills the launch (every process of it, the detached ones too), closes the
// owner's session, and forgets the run; the next run of the rollout starts
// over.
func TestClientGone(t *testing.T) {
	e := newEnv(t, options{})
	id := e.rollout("gone")
	ctx, cancel := context.WithCancel(t.Context())
	ch := make(chan runReply, 1)
	go func() { ch <- postRun(ctx, e.ctl.url, "/run", id, e.body(id, 100, 0.3)) }()
	e.waitStepped(id)
	if live := e.liveHarnesses(); len(live) != 1 {
		t.Fatalf("live harnesses %v, want the run's", live)
	}
	cancel()
	if r := <-ch; r.err == nil {
		t.Fatalf("the cancelled request got a reply: %s", r)
	}
	eventually(t, "the cancelled run's launch is killed and the run forgotten", func() (bool, string) {
		left := e.leftovers()
		h := e.health()
		return len(left) == 0 && h.Runs == 0, fmt.Sprintf("processes %v, runs %d", left, h.Runs)
	})
	res := postRun(t.Context(), e.ctl.url, "/run", id, e.body(id, 3, 0.05)).result(t)
	checkOneLaunchFresh(t, id, res, 3)
}

// TestRolloutPath: the rollout and attempt come from the path
// /ng-rollout/<id>[-a<attempt>]/run as the framework prefixes them, and a
// body whose rollout_id is the whole path word keeps it whole (a rollout id
// may itself end in -a<digits>).
func TestRolloutPath(t *testing.T) {
	e := newEnv(t, options{})
	cases := []struct {
		path, bodyID, rollout string
		attempt               int
	}{
		{"/ng-rollout/" + e.rollout("y-a2") + "/run", "", e.rollout("y"), 2},
		{"/ng-rollout/" + e.rollout("x-a7") + "/run", e.rollout("x-a7"), e.rollout("x-a7"), 1},
		{"/ng-rollout/" + e.rollout("z") + "/run", e.rollout("z"), e.rollout("z"), 1},
		{"/ng-rollout/" + e.rollout("w-a3") + "/run", e.rollout("w"), e.rollout("w"), 3},
	}
	chans := make([]<-chan runReply, len(cases))
	for i, c := range cases {
		b := e.body(c.bodyID, 2, 0.05)
		if c.bodyID == "" {
			delete(b, "rollout_id")
		}
		chans[i] = e.startRun(c.path, c.rollout, b)
	}
	for i, c := range cases {
		res := await(t, chans[i]).result(t)
		want := driver.LaunchID(c.rollout, c.attempt, 1)
		if res.Reward != 1 || len(res.Launches) != 1 || res.Launches[0].ID != want {
			t.Errorf("POST %s (body rollout_id %q): reward %v, launches %+v; want one launch %s", c.path, c.bodyID, res.Reward, res.Launches, want)
		}
	}
}
