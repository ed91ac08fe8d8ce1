package gyme2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"

	"github.com/ngharness/ngharness/pkg/gym"
)

// TestRetireForget: Gym's collection retires the attempt of a row whose
// /run failed (callers before callees: the agent, then the owner). The
// agent stops the attempt's launch and frees its state before it replies:
// every process the harness started is gone by then. Both servers count
// the rollout in retired_rollouts; a /run of the retired attempt is
// refused stale_attempt (and stays refused), and so is the owner's seed of
// it under Gym's /ng-rollout/<key>/ prefix; a later attempt runs from
// its input; once it finished, forget lifts the mark everywhere and the
// rollout's attempt 0 is admitted again.
func TestRetireForget(t *testing.T) {
	w := newWorld(t, options{})
	r := w.coll.row(1, 0, job{steps: 20, stepS: 0.3})
	ch := w.coll.start(r)
	w.waitStepped(rolloutID(r))
	live := w.harnessProcs(rolloutID(r))
	if len(live) == 0 {
		t.Fatalf("no live harness process recorded for %s", rolloutID(r))
	}

	w.coord.retire("retire", episodes(r), deadlineIn(waitLimit))
	if left := stillRunning(live); len(left) > 0 {
		t.Errorf("retire replied while the attempt's processes still run: %v", left)
	}
	t.Logf("the retired run's /run: %s", await(t, ch))
	for _, m := range w.coord.members {
		if st := w.coord.status(m); st.RetiredRollouts != 1 {
			t.Errorf("%s after retire: retired_rollouts %d, want 1", m.Name, st.RetiredRollouts)
		}
	}
	for range 2 { // the mark does not wear off
		w.coll.post(t.Context(), r).refusal(t, gym.CodeStaleAttempt)
	}
	// The owner refuses the retired attempt on its data plane too: a seed
	// bound to the attempt by Gym's /ng-rollout/<key>/ prefix.
	seed := w.postOwner(t, "/ng-rollout/"+episode(r).CaptureKey()+"/seed_session", nil, r)
	checkRefusal(t, seed, gym.CodeStaleAttempt)

	later := nextAttempt(r)
	later["fake"] = map[string]any{"steps": 3, "step_s": 0.05}
	later["check"] = "true"
	if res := w.coll.post(t.Context(), later).reply(t); res.Reward != 1 || len(res.Launches) != 1 || res.Launches[0].Resumed {
		t.Errorf("the later attempt: reward %v launches %+v, want 1 and one first launch", res.Reward, res.Launches)
	}
	w.coord.forget("forget", []string{rolloutID(r)}, deadlineIn(waitLimit))
	for _, m := range w.coord.members {
		if st := w.coord.status(m); st.RetiredRollouts != 0 {
			t.Errorf("%s after forget: retired_rollouts %d, want 0", m.Name, st.RetiredRollouts)
		}
	}
	again := w.coll.row(1, 0, job{steps: 2, stepS: 0.05})
	again["check"] = "true"
	if res := w.coll.post(t.Context(), again).reply(t); res.Reward != 1 {
		t.Errorf("attempt 0 after forget: reward %v, want 1", res.Reward)
	}
}

// harnessProcs lists the live processes the fake harness of a rollout's
// sessions recorded (any attempt).
func (w *world) harnessProcs(rollout string) []e2eproc.Info {
	files, _ := filepath.Glob(filepath.Join(w.base, "sandboxes", "*", ".ngharness", "state", "fake", rollout+"-a*", "pids"))
	var out []e2eproc.Info
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(data), "\n") {
			_, pidText, ok := strings.Cut(strings.TrimSpace(line), " ")
			if !ok {
				continue
			}
			pid, err := strconv.Atoi(pidText)
			if err != nil {
				continue
			}
			if info, ok := e2eproc.ReadProc(pid); ok && info.State != "Z" && info.Start >= w.since {
				out = append(out, info)
			}
		}
	}
	return out
}

// stillRunning lists the processes of ps that still run (same pid and
// start time, not a zombie).
func stillRunning(ps []e2eproc.Info) []e2eproc.Info {
	var out []e2eproc.Info
	for _, p := range ps {
		if p.Alive() {
			out = append(out, p)
		}
	}
	return out
}

// TestLeaseExpiry: with lease_grace_seconds 2, a prepared checkpoint that
// nobody resumes resumes on its own once deadline_ts + 2 s has passed:
// lease_expires_at is exactly that (renew moves it to max(current,
// deadline_ts + grace)),
// the participants go back to idle and accepting, the paused run goes on
// and finishes with every step once, and the expired id is fenced
// (stale_checkpoint) as a resumed one.
func TestLeaseExpiry(t *testing.T) {
	w := newWorld(t, options{leaseGrace: 2})
	r := w.coll.row(1, 0, job{steps: 8, stepS: 0.3})
	ch := w.coll.start(r)
	w.waitStepped(rolloutID(r))
	id := ckID("lease")
	deadline := deadlineIn(8 * time.Second)
	if p := w.coord.prepare(id, deadline); !p.prepared {
		t.Fatalf("prepare: %+v", p.replies)
	}
	for _, m := range w.coord.members {
		st := w.coord.status(m)
		if st.LeaseExpiresAt == nil || math.Abs(*st.LeaseExpiresAt-(deadline+2)) > 1e-3 {
			t.Errorf("%s: lease_expires_at %v, want deadline_ts + 2 = %f", m.Name, deref(st.LeaseExpiresAt), deadline+2)
		}
	}
	// A renew with an earlier deadline keeps the lease (the max of the two).
	for name, rr := range w.coord.renew(id, deadline-10) {
		if math.Abs(rr.LeaseExpiresAt-(deadline+2)) > 1e-3 {
			t.Errorf("%s: renew to an earlier deadline answered %f, want the current %f", name, rr.LeaseExpiresAt, deadline+2)
		}
	}
	for name, rr := range w.coord.renew(id, deadline+1) {
		if math.Abs(rr.LeaseExpiresAt-(deadline+3)) > 1e-3 {
			t.Errorf("%s: renew to a later deadline answered %f, want %f", name, rr.LeaseExpiresAt, deadline+3)
		}
	}
	testkit.Eventually(t, "every participant resumes on its own once the lease passed", func() (bool, string) {
		var open []string
		for _, m := range w.coord.members {
			if st := w.coord.status(m); st.Phase != gym.PhaseIdle || (st.Accepting != nil && !*st.Accepting) {
				open = append(open, m.Name+":"+string(st.Phase))
			}
		}
		return len(open) == 0, strings.Join(open, ", ")
	})
	for _, m := range w.coord.members {
		checkRefusal(t, w.coord.to(m, gym.OpPrepare, plainBody(id, deadlineIn(waitLimit))), gym.CodeStaleCheckpoint)
	}
	checkOneLaunch(t, w, rolloutID(r), await(t, ch).reply(t), 8, 1)
}

// postOwner posts a JSON body to path on the owner's data plane with the
// cookies (a session's, as its seed set them).
func (w *world) postOwner(t *testing.T, path string, cookies []*http.Cookie, body any) reply {
	t.Helper()
	r := w.postOwnerAsync(path, cookies, body)
	if r.status == 0 {
		t.Fatalf("%s", r.body)
	}
	return r
}

// postOwnerAsync is postOwner for a goroutine: a failure to send is a
// reply with status 0 and the error as its body.
func (w *world) postOwnerAsync(path string, cookies []*http.Cookie, body any) reply {
	r := reply{who: "owner " + path}
	data, err := json.Marshal(body)
	if err == nil {
		var req *http.Request
		if req, err = http.NewRequest(http.MethodPost, w.ownerURL()+path, bytes.NewReader(data)); err == nil {
			req.Header.Set("Content-Type", "application/json")
			for _, c := range cookies {
				req.AddCookie(c)
			}
			var resp *http.Response
			if resp, err = http.DefaultClient.Do(req); err == nil {
				defer resp.Body.Close()
				r.status = resp.StatusCode
				r.body, _ = io.ReadAll(resp.Body)
				r.cookies = resp.Cookies()
				return r
			}
		}
	}
	r.body = []byte(fmt.Sprintf("POST %s: %v", path, err))
	return r
}

// TestLeaseExpiresAfterRestore: a controller that restored and then died
// before resuming leaves the participants restored with admission closed;
// with lease_grace_seconds 2 they resume on their own once the restore's
// deadline_ts + 2 s has passed, keeping what they restored: the row posted
// again as its next attempt still continues from its bookmark.
func TestLeaseExpiresAfterRestore(t *testing.T) {
	const steps = 10
	w := newWorld(t, options{steps: steps, leaseGrace: 2})
	r := w.coll.row(1, 0, job{steps: steps, stepS: 0.3})
	ch := w.coll.start(r)
	w.waitSteps(2, rolloutID(r))
	ck := w.checkpoint(ckID("lapse"), episodes(r), false)
	done := len(e2eproc.SessionSteps(w.base, rolloutID(r)))
	w.crash()
	if res := await(t, ch); res.err == nil && res.status == http.StatusOK {
		t.Fatalf("%s returned although its servers were killed", res)
	}
	w.startServers()
	rid := restoreID()
	w.coord.restore(rid, ck.dir, ck.scope, deadlineIn(8*time.Second))
	testkit.Eventually(t, "every participant resumes on its own once the restore's lease passed", func() (bool, string) {
		var open []string
		for _, m := range w.coord.members {
			if st := w.coord.status(m); st.Phase != gym.PhaseIdle || (st.Accepting != nil && !*st.Accepting) {
				open = append(open, m.Name+":"+string(st.Phase))
			}
		}
		return len(open) == 0, strings.Join(open, ", ")
	})
	checkContinued(t, w, rolloutID(r), w.coll.post(t.Context(), nextAttempt(r)).reply(t), steps, done, true)
}
