package driver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/gym"
)

// badBookmarks are the malformed bookmarks, each with the class of its
// error and a phrase the error must say.
var badBookmarks = []struct {
	name, bookmark string
	class          error
	says           string
}{
	{"not-json", `{"v": 1, "next": "seed"`, driver.ErrBadBookmark, "unexpected end of JSON"},
	{"empty", ``, driver.ErrBadBookmark, "empty"},
	{"blank", " \n\t", driver.ErrBadBookmark, "empty"},
	{"not-an-object", `["v", 1]`, driver.ErrBadBookmark, "cannot unmarshal array"},
	{"null", `null`, driver.ErrBadBookmark, `no version field "v"`},
	{"no-version", `{"next": "seed"}`, driver.ErrBadBookmark, `no version field "v"`},
	{"version-2", `{"v": 2, "next": "seed"}`, driver.ErrBookmarkVersion, "version 2"},
	{"version-0", `{"v": 0, "next": "seed"}`, driver.ErrBookmarkVersion, "version 0"},
	{"version-string", `{"v": "1", "next": "seed"}`, driver.ErrBadBookmark, "not an integer"},
	{"version-fraction", `{"v": 1.5, "next": "seed"}`, driver.ErrBadBookmark, "not an integer"},
	{"no-next", `{"v": 1}`, driver.ErrBadBookmark, `no "next" stage`},
	{"unknown-stage", `{"v": 1, "next": "launch"}`, driver.ErrBadBookmark, `unknown stage "launch"`},
	{"harness-without-state", `{"v": 1, "next": "harness", "cookies": {"session_id": "x"}}`, driver.ErrBadBookmark, "needs the adapter's state"},
	{"verify-without-response", `{"v": 1, "next": "verify", "state": {"session_dir": "/s"}}`, driver.ErrBadBookmark, "needs the harness's response"},
	{"return-without-result", `{"v": 1, "next": "return", "response": {}}`, driver.ErrBadBookmark, "needs the result"},
	{"unknown-field", `{"v": 1, "next": "seed", "sandbox_handle": "sb-1"}`, driver.ErrBadBookmark, `unknown field "sandbox_handle"`},
	{"wrong-type", `{"v": 1, "next": "seed", "resume": "yes"}`, driver.ErrBadBookmark, "resume"},
	{"trailing-data", `{"v": 1, "next": "seed"} {"v": 1}`, driver.ErrBadBookmark, "after top-level value"},
	{"trailing-garbage", `{"v": 1, "next": "seed"}x`, driver.ErrBadBookmark, "after top-level value"},
	{"launch-unknown-outcome", `{"v": 1, "next": "seed", "launches": [{"id": "l1", "outcome": "exploded"}]}`, driver.ErrBadBookmark, `unknown outcome "exploded"`},
	{"launch-without-id", `{"v": 1, "next": "seed", "launches": [{"outcome": "finished"}]}`, driver.ErrBadBookmark, "has no id"},
	{"paused-without-folder", `{"v": 1, "next": "harness", "state": {}, "paused": {"id": "l1"}}`, driver.ErrBadBookmark, "no id or folder"},
	{"restart-paused", `{"v": 1, "next": "harness", "restart": true, "state": {}, "paused": {"id": "l1", "dir": "/d"}}`, driver.ErrBadBookmark, "never parked"},
}

// TestParseBookmarkRejectsEveryMalformedBookmark proves that ParseBookmark
// rejects each malformed bookmark with an error of the right class
// (ErrBadBookmark or ErrBookmarkVersion) that says what is wrong, and reads
// back what Marshal wrote.
func TestParseBookmarkRejectsEveryMalformedBookmark(t *testing.T) {
	t.Parallel()
	for _, c := range badBookmarks {
		_, err := driver.ParseBookmark([]byte(c.bookmark))
		if err == nil || !errors.Is(err, c.class) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: ParseBookmark(%q) = %v; want an error wrapping %q that says %q", c.name, c.bookmark, err, c.class, c.says)
		}
	}
	good := driver.Bookmark{Next: driver.StageHarness, Cookies: map[string]string{"session_id": "s"}, State: json.RawMessage(`{"session_dir":"/x"}`),
		Resume: true, Paused: &launch.Ref{ID: "l1", Dir: "/d/l1", SandboxID: "sb"},
		Launches: []driver.LaunchRecord{{ID: "l1", Outcome: driver.OutcomeInterrupted, Pauses: 1}}}
	data, err := good.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := driver.ParseBookmark(data)
	if err != nil {
		t.Fatalf("a bookmark Marshal wrote does not parse: %v\n%s", err, data)
	}
	again, _ := back.Marshal()
	if !bytes.Equal(again, data) {
		t.Errorf("a bookmark changed on the way through:\n%s\n%s", data, again)
	}
}

// storedResult is the result a return bookmark holds.
const storedResult = `{"reward":0.5,"rollout_id":"kept","response":{"text":"stored"},"ng_harness_launches":[{"id":"kept-a1-l1","sandbox_id":"sb-x","resumed":false,"reason":"first launch","duration_s":1,"outcome":"finished","exit_code":0,"pauses":0,"supervised":true,"started_at":"2026-01-01T00:00:00Z"}]}`

// TestBadBookmarkRefusesTheRestore proves, for every malformed bookmark,
// that a restore holding it is refused whole, as Gym's install is (nothing
// installed: a restore is all or nothing), with an error that names the
// bad record's episode, wraps ErrBadBookmark or ErrBookmarkVersion and
// gym.ErrCheckpointState (422), and does not blame the good record restored
// with it; the participant is left idle with nothing installed, so a later
// good restore still works.
func TestBadBookmarkRefusesTheRestore(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	for _, c := range badBookmarks {
		good, bad := e.Rollout("good-"+c.name), e.Rollout("bad-"+c.name)
		p := drivertest.NewParticipant()
		rn := e.Runner(drivertest.Fake(steps, stepS), p)
		kept := json.RawMessage(`{"v":1,"next":"return","result":` + storedResult + `}`)
		recs := []record{
			{RolloutID: bad, Attempt: 1, Bookmark: json.RawMessage(c.bookmark)},
			{RolloutID: good, Attempt: 1, Bookmark: kept},
		}
		err := restoreRecords(t, p, recs)
		if err == nil {
			t.Fatalf("%s: Restore accepted %q", c.name, c.bookmark)
		}
		says := c.says
		if !json.Valid([]byte(c.bookmark)) {
			// Not JSON, so a record can hold it only as a string.
			says = "cannot unmarshal string"
		}
		if !errors.Is(err, c.class) || !errors.Is(err, gym.ErrCheckpointState) || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: Restore = %v; want an error naming %s, wrapping %q and the checkpoint state class, saying %q", c.name, err, bad, c.class, says)
		}
		if strings.Contains(errString(err), good) {
			t.Errorf("%s: Restore's error blames the good record too: %v", c.name, err)
		}
		if st := p.Control().Status(); st.Phase != gym.PhaseIdle || st.Report.Counts["sessions"] != 0 {
			t.Errorf("%s: after the refused restore the participant is %s with %d sessions, want idle with none", c.name, st.Phase, st.Report.Counts["sessions"])
		}
		if err := restoreRecords(t, p, recs[1:]); err != nil {
			t.Fatalf("%s: a good restore after the refused one: %v", c.name, err)
		}
		res, err := rn.Run(context.Background(), driver.RunRequest{RolloutID: good, Attempt: 2, Body: drivertest.Task(good, steps, stepS, nil)})
		if err != nil {
			t.Errorf("%s: the good record did not continue: %v", c.name, err)
		} else if !bytes.Equal(res, json.RawMessage(storedResult)) {
			t.Errorf("%s: the good record returned %s, want its stored result", c.name, res)
		}
	}
	if calls := e.Owner.Calls(""); len(calls) != 0 {
		t.Errorf("the owner was called: %+v", calls)
	}
	if execs := e.Backend.Execs(); len(execs) != 0 {
		t.Errorf("the driver ran %d commands in a sandbox, the first %v", len(execs), execs[0].Argv)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestReturnBookmarkReturnsStoredResult proves that a continuation at
// return returns the stored result, byte for byte, without any owner call
// and without running anything in a sandbox.
func TestReturnBookmarkReturnsStoredResult(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ro := e.Rollout("at-return")
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	bm := json.RawMessage(`{"v":1,"next":"return","cookies":{"session_id":"gone"},"result":` + storedResult + `}`)
	if err := restoreRecords(t, p, []record{{RolloutID: ro, Attempt: 3, Bookmark: bm}}); err != nil {
		t.Fatal(err)
	}
	h := e.Start(rn, ro, 4, drivertest.Task(ro, steps, stepS, nil))
	raw, err := h.Wait(t)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, json.RawMessage(storedResult)) {
		t.Errorf("got %s, want the stored result %s", raw, storedResult)
	}
	if calls := e.Owner.Calls(""); len(calls) != 0 {
		t.Errorf("the owner was called: %+v", calls)
	}
	if execs := e.Backend.Execs(); len(execs) != 0 {
		t.Errorf("the driver ran %d commands in a sandbox, the first %v", len(execs), execs[0].Argv)
	}
}

// TestVerifyBookmarkGradesAgainWithoutLaunching proves that a continuation
// at verify grades again without launching: the owner's verify runs (and
// rewards the work already in the sandbox), nothing else of the owner is
// called, no launch folder is created and nothing runs in the sandbox; the
// result carries the stored response and launch records.
func TestVerifyBookmarkGradesAgainWithoutLaunching(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ro := e.Rollout("at-verify")
	body := drivertest.Task(ro, 3, stepS, map[string]any{
		"files": map[string]string{"progress": "step 1\nstep 2\nstep 3\n"},
	})
	seeded, err := e.LocalOwner.SeedSession(context.Background(), "", body)
	if err != nil {
		t.Fatal(err)
	}
	e.Owner.Adopt(ro, seeded.Cookies)
	sbID := e.Session(ro).SandboxID
	launch := driver.LaunchRecord{ID: driver.LaunchID(ro, 1, 1, sbID), SandboxID: sbID, Reason: "first launch", Outcome: driver.OutcomeFinished, Pauses: 1, Supervised: true}
	bm, err := driver.Bookmark{Next: driver.StageVerify, Cookies: seeded.Cookies, State: json.RawMessage(`{"session_dir":"/sandbox/.ngharness/state/fake/x"}`),
		Response: json.RawMessage(`{"exit_code":0,"session":["step 1","step 2","step 3"],"session_path":"/sandbox/.ngharness/state/fake/x/steps","stdout_tail":"{\"text\":\"done after 3 steps\",\"steps\":3,\"first_step\":1}\n"}`), Launches: []driver.LaunchRecord{launch}}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(3, stepS), p)
	if err := restoreRecords(t, p, []record{{RolloutID: ro, Attempt: 1, Bookmark: bm}}); err != nil {
		t.Fatal(err)
	}
	r := e.Start(rn, ro, 2, body).MustSucceed(t)
	checkVerified(t, e, ro, r)
	if r.Fake.Text != "done after 3 steps" || len(r.Launches) != 1 || r.Launches[0].ID != launch.ID || r.Launches[0].Pauses != 1 {
		t.Errorf("the result does not carry the stored response and launches: %s", r.Raw)
	}
	for _, m := range []string{drivertest.CallSeed, drivertest.CallSandboxAccess, drivertest.CallClose} {
		if n := e.Owner.Count(m, ro); n != 0 {
			t.Errorf("the owner's %s was called %d times", m, n)
		}
	}
	if n := e.Owner.Count(drivertest.CallVerify, ro); n != 1 {
		t.Errorf("the owner's verify ran %d times, want once", n)
	}
	if _, err := os.Stat(filepath.Join(e.HostPath(sbID), ".ngharness", "launches")); !os.IsNotExist(err) {
		t.Errorf("a launch folder was created (%v)", err)
	}
	if execs := e.Backend.Execs(); len(execs) != 0 {
		t.Errorf("the driver ran %d commands in a sandbox, the first %v", len(execs), execs[0].Argv)
	}
}

// TestRestoredRestartRecordStartsOver proves that a restored record of a
// restart run (one nothing could save) is not continued: the next attempt
// starts over from its input with a new seed and a fresh launch.
func TestRestoredRestartRecordStartsOver(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ro := e.Rollout("restart-record")
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	bm := json.RawMessage(`{"v":1,"next":"harness","restart":true,"cookies":{"session_id":"old"},"state":{"session_dir":"/sandbox/.ngharness/state/fake/old"},"resume":true,"launches":[{"id":"old-a1-l1","outcome":"interrupted"}]}`)
	if err := restoreRecords(t, p, []record{{RolloutID: ro, Attempt: 1, Bookmark: bm}}); err != nil {
		t.Fatal(err)
	}
	r := e.Start(rn, ro, 2, drivertest.Task(ro, 3, 0.1, nil)).MustSucceed(t)
	if len(r.Launches) != 1 || r.Launches[0].Resumed || r.Launches[0].Reason != "first launch" || r.Launches[0].ID != driver.LaunchID(ro, 2, 1, r.Launches[0].SandboxID) {
		t.Errorf("want one fresh launch of attempt 2, got %+v", r.Launches)
	}
	if n := e.Owner.Count(drivertest.CallSeed, ro); n != 1 {
		t.Errorf("seeded %d times, want once", n)
	}
	checkVerified(t, e, ro, r)
}

// TestRestoredSeedRecordStartsAtSeed proves that a run exported at its seed
// bookmark (queued, or in its seed step) continues after a crash from seed:
// the next attempt (the record's attempt + 1) seeds and launches fresh.
func TestRestoredSeedRecordStartsAtSeed(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ro := e.Rollout("seed-record")
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	if err := restoreRecords(t, p, []record{{RolloutID: ro, Attempt: 1, Bookmark: json.RawMessage(`{"v":1,"next":"seed"}`)}}); err != nil {
		t.Fatal(err)
	}
	r := e.Start(rn, ro, 2, drivertest.Task(ro, 3, 0.1, nil)).MustSucceed(t)
	if len(r.Launches) != 1 || r.Launches[0].Resumed || r.Launches[0].ID != driver.LaunchID(ro, 2, 1, r.Launches[0].SandboxID) {
		t.Errorf("want one fresh launch of attempt 2, got %+v", r.Launches)
	}
	if n := e.Owner.Count(drivertest.CallSeed, ro); n != 1 {
		t.Errorf("seeded %d times, want once", n)
	}
	checkVerified(t, e, ro, r)
}
