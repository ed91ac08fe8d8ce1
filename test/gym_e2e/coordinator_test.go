package gyme2e

// The coordinator: Gym's checkpoint coordination (nemo_gym/_checkpoint/
// coordination.py at 011c3386d691fd51a0ee388026c59660fcbffdac) played step
// by step. discover applies Gym's discover rules (gymDiscover): it probes
// every server entry of the deployment's config with GET status (404: not
// a participant; a server down, silent, failing or of an unknown kind
// fails the discovery), refuses a deployment with no policy model taking
// part, and orders the participants by PREPARE_ORDER; prepare runs stage by stage and
// stops at the first stage not prepared; commit and restore fan out to every
// participant at once; resume runs the stages in reverse; retire and forget
// run in RETIRE_ORDER. Every reply is checked as Gym reads it before it is
// used, and a refusal must be the error envelope with its code's status.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/pkg/driver/config/gymconfig"
	"github.com/ngharness/ngharness/pkg/gym"
)

// prepareOrder and retireOrder are coordination.py's PREPARE_ORDER and
// RETIRE_ORDER.
var (
	prepareOrder = []string{"environment", "model", "agent", "resources"}
	retireOrder  = [][]string{{"environment"}, {"agent"}, {"model", "resources"}}
)

// member is one participant the coordinator discovered.
type member struct {
	Name     string // the server's entry name in the Gym config
	Kind     string
	Instance string // as its status names it
	URL      string
}

// coordinator drives the participants of one deployment.
type coordinator struct {
	t       *testing.T
	token   string
	members []member
	client  *http.Client
	// discoverTimeout is how long discover waits for a status reply
	// (0: discoverTimeout).
	discoverTimeout time.Duration
}

func newCoordinator(t *testing.T, token string) *coordinator {
	return &coordinator{t: t, token: token, client: &http.Client{Timeout: 5 * time.Minute}}
}

// reply is one control call's answer.
type reply struct {
	who     string // "<server> <op>"
	status  int
	body    []byte
	cookies []*http.Cookie // the cookies an owner's seed set
}

func (r reply) String() string {
	return fmt.Sprintf("%s: HTTP %d %s", r.who, r.status, e2eproc.Tail(string(bytes.TrimSpace(r.body)), 1500))
}

// bearer is the Authorization header of the deployment's control token.
func (c *coordinator) bearer() string { return "Bearer " + c.token }

// call sends one control request to url: GET status, or POST op with body
// (a []byte or string is sent as is, anything else as JSON), with the
// Authorization header auth ("" sends none).
func (c *coordinator) call(name, url, op string, body any, auth string) reply {
	c.t.Helper()
	method, rd := http.MethodPost, io.Reader(nil)
	switch b := body.(type) {
	case nil:
		method = http.MethodGet
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, url+gym.RoutePrefix+"/"+op, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", name, op, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return reply{who: name + " " + op, status: resp.StatusCode, body: data}
}

// to sends op with body to member m with the right token.
func (c *coordinator) to(m member, op string, body any) reply {
	c.t.Helper()
	return c.call(m.Name, m.URL, op, body, c.bearer())
}

// member returns the participant of kind (there is one of each here).
func (c *coordinator) member(kind string) member {
	c.t.Helper()
	for _, m := range c.members {
		if m.Kind == kind {
			return m
		}
	}
	c.t.Fatalf("no %s participant was discovered (members %+v)", kind, c.members)
	return member{}
}

// discoverTries and discoverTimeout are coordination.py's _DISCOVER_TRIES
// and _DISCOVER_TIMEOUT_SECONDS: a connection error is tried this many
// times in all, and a server that never replies fails discovery after this
// long.
const (
	discoverTries   = 3
	discoverTimeout = 60 * time.Second
)

// coordinationError is coordination.py's CoordinationError: the operation
// and, by server, what failed.
type coordinationError struct {
	op       string
	failures map[string]string
}

func (e *coordinationError) Error() string {
	names := slices.Sorted(maps.Keys(e.failures))
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + ": " + e.failures[n]
	}
	return fmt.Sprintf("checkpoint %s failed on %d participant(s): %s", e.op, len(e.failures), strings.Join(parts, "; "))
}

// discover finds the deployment's participants with gymDiscover (Gym's
// rules; any error fails the test) and checks each one's status reply
// field by field; they become the coordinator's members.
func (c *coordinator) discover(servers []gymconfig.Server) []member {
	c.t.Helper()
	members, replies, err := c.gymDiscover(servers)
	if err != nil {
		c.t.Fatalf("discover: %v", err)
	}
	for _, m := range members {
		c.checkStatus(replies[m.Name], m.Kind)
	}
	c.members = members
	return members
}

// gymDiscover is coordination.discover of NVIDIA-NeMo/Gym at
// 011c3386d691fd51a0ee388026c59660fcbffdac (nemo_gym/_checkpoint/
// coordination.py), rule for rule. servers are the config's entries that
// hold a server type (gymconfig.Servers). Each is probed at once with GET
// status and the bearer token: 404 means not a participant; a connection
// error is tried discoverTries times in all; no reply within
// c.discoverTimeout, a reply other than 200, one without a kind, or a kind
// outside PREPARE_ORDER is that server's failure. Any failure fails the
// discovery, naming every failed server; so does a deployment in which no
// participant is of kind model ("deployment: no policy model takes part in
// checkpoints"). The members are sorted by (kind's place in PREPARE_ORDER,
// name). It returns each member's status reply beside them.
func (c *coordinator) gymDiscover(servers []gymconfig.Server) ([]member, map[string]reply, error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var members []member
	replies := map[string]reply{}
	failures := map[string]string{}
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, kind, instance, err := c.probe(s)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				failures[s.Name] = err.Error()
			case r.status != http.StatusNotFound:
				members = append(members, member{Name: s.Name, Kind: kind, Instance: instance, URL: s.URL})
				replies[s.Name] = r
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		return nil, nil, &coordinationError{op: "discover", failures: failures}
	}
	if !slices.ContainsFunc(members, func(m member) bool { return m.Kind == gym.KindModel }) {
		return nil, nil, &coordinationError{op: "discover", failures: map[string]string{"deployment": "no policy model takes part in checkpoints"}}
	}
	sort.Slice(members, func(i, j int) bool {
		a, b := slices.Index(prepareOrder, members[i].Kind), slices.Index(prepareOrder, members[j].Kind)
		return a < b || a == b && members[i].Name < members[j].Name
	})
	return members, replies, nil
}

// probe is discover's probe of one server: its status reply (404 is no
// error: not a participant) and, for a participant, its kind and instance.
func (c *coordinator) probe(s gymconfig.Server) (reply, string, string, error) {
	if s.Err != nil {
		return reply{}, "", "", s.Err
	}
	timeout := c.discoverTimeout
	if timeout == 0 {
		timeout = discoverTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	noReply := fmt.Errorf("no status reply within %s seconds", strconv.FormatFloat(timeout.Seconds(), 'g', -1, 64))
	var r reply
	for try := 1; ; try++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+gym.RoutePrefix+"/"+gym.OpStatus, nil)
		if err != nil {
			return r, "", "", err
		}
		req.Header.Set("Authorization", c.bearer())
		resp, err := c.client.Do(req)
		var op *net.OpError
		switch {
		case ctx.Err() != nil:
			return r, "", "", noReply
		case err != nil && errors.As(err, &op) && op.Op == "dial" && try < discoverTries:
			continue
		case err != nil:
			return r, "", "", err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if ctx.Err() != nil {
			return r, "", "", noReply
		}
		if err != nil {
			return r, "", "", err
		}
		r = reply{who: s.Name + " " + gym.OpStatus, status: resp.StatusCode, body: data}
		break
	}
	if r.status == http.StatusNotFound {
		return r, "", "", nil
	}
	if r.status != http.StatusOK {
		return r, "", "", participantError(r)
	}
	var st struct {
		Kind     *string `json:"kind"`
		Instance string  `json:"instance"`
	}
	if err := json.Unmarshal(r.body, &st); err != nil {
		return r, "", "", fmt.Errorf("the status reply is not JSON: %v", err)
	}
	if st.Kind == nil {
		return r, "", "", errors.New("the status reply has no kind")
	}
	if !slices.Contains(prepareOrder, *st.Kind) {
		return r, "", "", fmt.Errorf("unknown participant kind '%s'", *st.Kind)
	}
	return r, *st.Kind, st.Instance, nil
}

// participantError is coordination.py's _ParticipantError of a reply
// other than 200: "HTTP <status> <code> <detail>", or the first 200 bytes
// of the body when it is not the envelope.
func participantError(r reply) error {
	var env struct {
		Error struct {
			Code   string `json:"code"`
			Detail string `json:"detail"`
		} `json:"error"`
	}
	json.Unmarshal(r.body, &env)
	detail := env.Error.Detail
	if detail == "" {
		detail = string(r.body[:min(len(r.body), 200)])
	}
	return fmt.Errorf("%s", strings.TrimSpace(fmt.Sprintf("HTTP %d %s %q", r.status, env.Error.Code, detail)))
}

// statusReply is GET status as the tests read it.
type statusReply struct {
	Kind            string     `json:"kind"`
	Instance        string     `json:"instance"`
	Phase           gym.Phase  `json:"phase"`
	CheckpointID    *string    `json:"checkpoint_id"`
	LeaseExpiresAt  *float64   `json:"lease_expires_at"`
	RetiredRollouts int        `json:"retired_rollouts"`
	Report          gym.Report `json:"report"`
	Accepting       *bool      `json:"accepting"` // the agent's extra
}

// status reads a participant's status.
func (c *coordinator) status(m member) statusReply {
	c.t.Helper()
	return c.checkStatus(c.to(m, gym.OpStatus, nil), m.Kind)
}

var phases = []gym.Phase{gym.PhaseIdle, gym.PhasePreparing, gym.PhasePrepared, gym.PhaseCommitted, gym.PhaseRestored}

// checkStatus checks a status reply field by field; kind, when set, is the
// kind the participant must have.
func (c *coordinator) checkStatus(r reply, kind string) statusReply {
	c.t.Helper()
	if r.status != http.StatusOK {
		c.t.Fatalf("%s", r)
	}
	f, err := checkShape(r.who, r.body, statusShape, anyExtra)
	if err != nil {
		c.t.Fatal(err)
	}
	var st statusReply
	decode(c.t, r, &st)
	if kind != "" && st.Kind != kind {
		c.t.Fatalf("%s: kind %q, want %q", r.who, st.Kind, kind)
	}
	if !gym.NamePattern.MatchString(st.Instance) {
		c.t.Errorf("%s: instance %q is not a safe name", r.who, st.Instance)
	}
	if !slices.Contains(phases, st.Phase) {
		c.t.Errorf("%s: unknown phase %q", r.who, st.Phase)
	}
	if (st.Phase == gym.PhaseIdle) != (st.CheckpointID == nil) {
		c.t.Errorf("%s: phase %s with checkpoint_id %v (null exactly when idle)", r.who, st.Phase, deref(st.CheckpointID))
	}
	if (st.Phase == gym.PhaseIdle) != (st.LeaseExpiresAt == nil) {
		c.t.Errorf("%s: phase %s with lease_expires_at %v (null exactly when idle)", r.who, st.Phase, deref(st.LeaseExpiresAt))
	}
	c.checkReport(r.who+" report", f["report"], st.Kind)
	// The participants' own fields (agent.py and resources.py status_extra).
	extras := map[string]shape{
		gym.KindAgent:     {"accepting": wBool},
		gym.KindResources: {"mode": wString, "verify": wString, "retired_sessions": wInt},
		gym.KindModel:     {"restored_generation_cuts": wStrings}, // model.py b58bb4f status_extra
	}[st.Kind]
	if _, err := checkShape(r.who+" ("+st.Kind+" extras)", r.body, extras, anyExtra); err != nil {
		c.t.Error(err)
	}
	return st
}

// checkReport checks a PrepareReport: ready exactly when nothing blocks
// (for a resources server, nothing blocks and no request is in flight), at
// most 100 blockers listed and all counted, capture keys throughout, and
// the agent's counts.
func (c *coordinator) checkReport(what string, raw json.RawMessage, kind string) gym.Report {
	c.t.Helper()
	if _, err := checkShape(what, raw, reportShape); err != nil {
		c.t.Fatal(err)
	}
	var rep gym.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	if len(rep.Blockers) > gym.MaxReportedBlockers || rep.BlockerCount < len(rep.Blockers) ||
		(rep.BlockerCount <= gym.MaxReportedBlockers && rep.BlockerCount != len(rep.Blockers)) {
		c.t.Errorf("%s: %d blockers listed, blocker_count %d", what, len(rep.Blockers), rep.BlockerCount)
	}
	// Ready means nothing blocks. Not ready with no blocker is the
	// resources server's requests in flight (resources.py readiness).
	if rep.Ready && rep.BlockerCount != 0 ||
		!rep.Ready && rep.BlockerCount == 0 && !(kind == gym.KindResources && rep.Counts["inflight"] > 0) {
		c.t.Errorf("%s: ready %v with blocker_count %d, counts %v", what, rep.Ready, rep.BlockerCount, rep.Counts)
	}
	for _, key := range append(slices.Clone(rep.Blockers), rep.Restarts...) {
		if _, err := gym.ParseCaptureKey(key); err != nil {
			c.t.Errorf("%s: %q is not a capture key: %v", what, key, err)
		}
	}
	if kind == gym.KindModel {
		// model.py b58bb4f merge_reports: ready exactly when no response
		// is streaming, which are the blockers.
		for _, k := range []string{"inflight", "held", "cut", "cut_failed", "cut_skipped"} {
			if _, ok := rep.Counts[k]; !ok {
				c.t.Errorf("%s: model counts %v have no %s", what, rep.Counts, k)
			}
		}
		if rep.Counts["held"] > rep.Counts["inflight"] {
			c.t.Errorf("%s: model counts %v: more held than in flight", what, rep.Counts)
		}
	}
	if kind == gym.KindAgent {
		s, ok1 := rep.Counts["sessions"]
		b, ok2 := rep.Counts["at_boundary"]
		if !ok1 || !ok2 || b > s {
			c.t.Errorf("%s: agent counts %v, want sessions and at_boundary (<= sessions)", what, rep.Counts)
		}
	}
	return rep
}

// prepareResult is coordination.prepare's PrepareResult.
type prepareResult struct {
	prepared bool
	replies  map[string]gym.PrepareReply
	raw      map[string][]byte // each reply's body
}

// restarts is PrepareResult.restarts: every restart key of every reply.
func (p prepareResult) restarts() []string {
	var out []string
	for _, r := range p.replies {
		out = append(out, r.Report.Restarts...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// continued is PrepareResult.continued: the scope without the restarts.
func (p prepareResult) continued(ids []gym.EpisodeID) []gym.EpisodeID {
	restarts := p.restarts()
	var out []gym.EpisodeID
	for _, id := range ids {
		if !slices.Contains(restarts, id.CaptureKey()) {
			out = append(out, id)
		}
	}
	return out
}

// prepare prepares stage by stage in PREPARE_ORDER, the members of a stage
// at once, and stops at the first stage with a member not prepared.
func (c *coordinator) prepare(id string, deadline float64) prepareResult {
	c.t.Helper()
	res := prepareResult{prepared: true, replies: map[string]gym.PrepareReply{}, raw: map[string][]byte{}}
	body := plainBody(id, deadline)
	for _, kind := range prepareOrder {
		stage := c.fanOut(c.ofKinds(kind), gym.OpPrepare, body)
		for _, m := range c.ofKinds(kind) {
			p := c.checkPrepare(m, stage[m.Name])
			res.replies[m.Name] = p
			res.raw[m.Name] = stage[m.Name].body
			if p.Phase != gym.PhasePrepared {
				res.prepared = false
			}
		}
		if !res.prepared {
			break
		}
	}
	return res
}

// checkPrepare checks a prepare reply: {phase, report} and nothing else, a
// phase a prepare can end in, and prepared only when ready.
func (c *coordinator) checkPrepare(m member, r reply) gym.PrepareReply {
	c.t.Helper()
	if r.status != http.StatusOK {
		c.t.Fatalf("%s", r)
	}
	f, err := checkShape(r.who, r.body, prepareShape)
	if err != nil {
		c.t.Fatal(err)
	}
	var p gym.PrepareReply
	p.Phase = phaseOf(c.t, r, f)
	p.Report = c.checkReport(r.who+" report", f["report"], m.Kind)
	if !slices.Contains([]gym.Phase{gym.PhasePrepared, gym.PhasePreparing, gym.PhaseIdle}, p.Phase) {
		c.t.Errorf("%s: phase %q after prepare", r.who, p.Phase)
	}
	if p.Phase == gym.PhasePrepared && !p.Report.Ready {
		c.t.Errorf("%s: prepared but not ready", r.who)
	}
	return p
}

// commitReply is a commit reply as the tests read it.
type commitReply struct {
	Phase      gym.Phase
	Manifest   map[string]any
	EpisodeIDs []string
	Fields     map[string]json.RawMessage // the whole reply
	Raw        []byte
}

// commit fans the commit out to every participant at once.
func (c *coordinator) commit(id, dir string, scope []gym.EpisodeID, stop bool, deadline float64) map[string]commitReply {
	c.t.Helper()
	replies := c.fanOut(c.members, gym.OpCommit, commitBody(id, dir, scope, stop, deadline))
	out := map[string]commitReply{}
	for _, m := range c.members {
		out[m.Name] = c.checkCommit(m, id, replies[m.Name])
	}
	return out
}

// checkCommit checks a commit reply: phase committed, the manifest of this
// participant and checkpoint, sorted capture keys.
func (c *coordinator) checkCommit(m member, id string, r reply) commitReply {
	c.t.Helper()
	if r.status != http.StatusOK {
		c.t.Fatalf("%s", r)
	}
	f, err := checkShape(r.who, r.body, commitShape, anyExtra)
	if err != nil {
		c.t.Fatal(err)
	}
	cr := commitReply{Phase: phaseOf(c.t, r, f), Fields: f, Raw: r.body}
	if cr.Phase != gym.PhaseCommitted {
		c.t.Errorf("%s: phase %q, want committed", r.who, cr.Phase)
	}
	if _, err := checkShape(r.who+" manifest", f["manifest"], manifestShape, anyExtra); err != nil {
		c.t.Fatal(err)
	}
	json.Unmarshal(f["manifest"], &cr.Manifest)
	json.Unmarshal(f["episode_ids"], &cr.EpisodeIDs)
	man := cr.Manifest
	if man["schema_version"] != float64(gym.StateSchemaVersion) || man["kind"] != m.Kind || man["instance"] != m.Instance || man["checkpoint_id"] != id {
		c.t.Errorf("%s: manifest %v, want schema 1, kind %s, instance %s, checkpoint %s", r.who, man, m.Kind, m.Instance, id)
	}
	sum, _ := man["records_sha256"].(string)
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(sum) || man["records_file"] != "records-"+sum+".jsonl" {
		c.t.Errorf("%s: manifest records_file %v, records_sha256 %v", r.who, man["records_file"], man["records_sha256"])
	}
	if !slices.IsSorted(cr.EpisodeIDs) || len(slices.Compact(slices.Clone(cr.EpisodeIDs))) != len(cr.EpisodeIDs) {
		c.t.Errorf("%s: episode_ids %q not sorted and distinct", r.who, cr.EpisodeIDs)
	}
	if n, _ := man["record_count"].(float64); int(n) < len(cr.EpisodeIDs) {
		c.t.Errorf("%s: %d episode_ids but record_count %v", r.who, len(cr.EpisodeIDs), man["record_count"])
	}
	for _, key := range cr.EpisodeIDs {
		if _, err := gym.ParseCaptureKey(key); err != nil {
			c.t.Errorf("%s: %q is not a capture key", r.who, key)
		}
	}
	return cr
}

// restore fans the restore out to every participant at once.
func (c *coordinator) restore(id, dir string, scope []gym.EpisodeID, deadline float64) map[string]gym.RestoreReply {
	c.t.Helper()
	replies := c.fanOut(c.members, gym.OpRestore, restoreBody(id, dir, scope, deadline))
	out := map[string]gym.RestoreReply{}
	for _, m := range c.members {
		out[m.Name] = c.checkRestore(replies[m.Name])
	}
	return out
}

func (c *coordinator) checkRestore(r reply) gym.RestoreReply {
	c.t.Helper()
	if r.status != http.StatusOK {
		c.t.Fatalf("%s", r)
	}
	f, err := checkShape(r.who, r.body, restoreShape)
	if err != nil {
		c.t.Fatal(err)
	}
	var rr gym.RestoreReply
	decode(c.t, r, &rr)
	if phaseOf(c.t, r, f) != gym.PhaseRestored {
		c.t.Errorf("%s: phase %q, want restored", r.who, rr.Phase)
	}
	if !slices.IsSorted(rr.Restored) {
		c.t.Errorf("%s: restored %q not sorted", r.who, rr.Restored)
	}
	for _, key := range rr.Restored {
		if id, err := gym.ParseCaptureKey(key); err != nil || id.Attempt == 0 {
			c.t.Errorf("%s: restored %q is not the capture key of a next attempt", r.who, key)
		}
	}
	return rr
}

// resume reopens every participant, the stages in reverse PREPARE_ORDER.
func (c *coordinator) resume(id string, deadline float64) map[string]gym.ResumeReply {
	c.t.Helper()
	out := map[string]gym.ResumeReply{}
	for i := len(prepareOrder) - 1; i >= 0; i-- {
		members := c.ofKinds(prepareOrder[i])
		replies := c.fanOut(members, gym.OpResume, plainBody(id, deadline))
		for _, m := range members {
			out[m.Name] = c.checkResume(replies[m.Name])
		}
	}
	return out
}

func (c *coordinator) checkResume(r reply) gym.ResumeReply {
	c.t.Helper()
	if r.status != http.StatusOK {
		c.t.Fatalf("%s", r)
	}
	f, err := checkShape(r.who, r.body, resumeShape)
	if err != nil {
		c.t.Fatal(err)
	}
	var rr gym.ResumeReply
	decode(c.t, r, &rr)
	if phaseOf(c.t, r, f) != gym.PhaseIdle {
		c.t.Errorf("%s: phase %q, want idle", r.who, rr.Phase)
	}
	return rr
}

// renew extends every participant's lease.
func (c *coordinator) renew(id string, deadline float64) map[string]gym.RenewReply {
	c.t.Helper()
	replies := c.fanOut(c.members, gym.OpRenew, plainBody(id, deadline))
	out := map[string]gym.RenewReply{}
	for _, m := range c.members {
		r := replies[m.Name]
		if r.status != http.StatusOK {
			c.t.Fatalf("%s", r)
		}
		if _, err := checkShape(r.who, r.body, renewShape); err != nil {
			c.t.Fatal(err)
		}
		var rr gym.RenewReply
		decode(c.t, r, &rr)
		out[m.Name] = rr
	}
	return out
}

// retire stops these attempts everywhere, callers before callees.
func (c *coordinator) retire(id string, eps []gym.EpisodeID, deadline float64) map[string]gym.RetireReply {
	c.t.Helper()
	body := map[string]any{"checkpoint_id": id, "deadline_ts": deadline, "episode_ids": episodeList(eps)}
	out := map[string]gym.RetireReply{}
	for _, kinds := range retireOrder {
		members := c.ofKinds(kinds...)
		replies := c.fanOut(members, gym.OpRetire, body)
		for _, m := range members {
			r := replies[m.Name]
			if r.status != http.StatusOK {
				c.t.Fatalf("%s", r)
			}
			if _, err := checkShape(r.who, r.body, retireShape); err != nil {
				c.t.Fatal(err)
			}
			var rr gym.RetireReply
			decode(c.t, r, &rr)
			want := make([]string, len(eps))
			for i, e := range eps {
				want[i] = e.CaptureKey()
			}
			if !slices.Equal(rr.Retired, want) {
				c.t.Errorf("%s: retired %q, want %q (request order)", r.who, rr.Retired, want)
			}
			out[m.Name] = rr
		}
	}
	return out
}

// forget lifts the retire marks of these rollouts everywhere, in
// RETIRE_ORDER, the ids sorted and distinct as Gym sends them.
func (c *coordinator) forget(id string, rollouts []string, deadline float64) {
	c.t.Helper()
	ids := slices.Clone(rollouts)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	body := map[string]any{"checkpoint_id": id, "deadline_ts": deadline, "rollout_ids": ids}
	for _, kinds := range retireOrder {
		members := c.ofKinds(kinds...)
		replies := c.fanOut(members, gym.OpForget, body)
		for _, m := range members {
			r := replies[m.Name]
			if r.status != http.StatusOK {
				c.t.Fatalf("%s", r)
			}
			if _, err := checkShape(r.who, r.body, forgetShape); err != nil {
				c.t.Fatal(err)
			}
			var fr gym.ForgetReply
			decode(c.t, r, &fr)
			if !slices.Equal(fr.Forgotten, ids) {
				c.t.Errorf("%s: forgotten %q, want %q", r.who, fr.Forgotten, ids)
			}
		}
	}
}

// ofKinds lists the members of these kinds, in discovery order.
func (c *coordinator) ofKinds(kinds ...string) []member {
	var out []member
	for _, m := range c.members {
		if slices.Contains(kinds, m.Kind) {
			out = append(out, m)
		}
	}
	return out
}

// fanOut sends op with body to every member at once and collects the
// replies by name.
func (c *coordinator) fanOut(members []member, op string, body any) map[string]reply {
	c.t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		c.t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]reply{}
	failures := map[string]error{}
	for _, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.post(m, op, data)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures[m.Name] = err
			}
			out[m.Name] = r
		}()
	}
	wg.Wait()
	for name, err := range failures {
		c.t.Fatalf("%s %s: %v", name, op, err)
	}
	return out
}

// post is call without the test's helpers, safe in a goroutine.
func (c *coordinator) post(m member, op string, data []byte) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, m.URL+gym.RoutePrefix+"/"+op, bytes.NewReader(data))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", c.bearer())
	resp, err := c.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return reply{who: m.Name + " " + op, status: resp.StatusCode, body: out}, err
}

// codeStatus is errors.py's table: the HTTP status of every code.
var codeStatus = map[string]int{
	gym.CodeRefused: 409, gym.CodeStaleCheckpoint: 409, gym.CodeConflict: 409, gym.CodeInvalidPhase: 409,
	gym.CodeDeadlineExceeded: 409, gym.CodeStaleAttempt: 409, gym.CodeCheckpointParked: 409,
	gym.CodeRestartInScope: 409, gym.CodeRolloutIDRequired: 400, gym.CodeUnauthorized: 401,
	gym.CodeCheckpointState: 422,
}

// checkRefusal checks that r is a refusal with code: the code's status and
// exactly {"error": {"code", "detail"}}, the detail one non-empty line.
func checkRefusal(t *testing.T, r reply, code string) {
	t.Helper()
	if want := codeStatus[code]; r.status != want {
		t.Errorf("%s: want HTTP %d %s", r, want, code)
		return
	}
	f, err := checkShape(r.who+" refusal", r.body, envelopeShape)
	if err != nil {
		t.Error(err)
		return
	}
	ef, err := checkShape(r.who+" refusal error", f["error"], errorShape)
	if err != nil {
		t.Error(err)
		return
	}
	var got, detail string
	json.Unmarshal(ef["code"], &got)
	json.Unmarshal(ef["detail"], &detail)
	if got != code {
		t.Errorf("%s: code %q, want %q", r, got, code)
	}
	if strings.TrimSpace(detail) == "" || strings.Contains(detail, "\n") {
		t.Errorf("%s: detail %q is not one line of text", r, detail)
	}
}

// checkValidation checks FastAPI's answer to a body that fails validation:
// 422 {"detail": [...]} (a list, not the envelope).
func checkValidation(t *testing.T, r reply) {
	t.Helper()
	var body struct {
		Detail []json.RawMessage `json:"detail"`
	}
	if r.status != http.StatusUnprocessableEntity || json.Unmarshal(r.body, &body) != nil || len(body.Detail) == 0 {
		t.Errorf("%s: want HTTP 422 with FastAPI's {\"detail\": [...]}", r)
	}
}

func plainBody(id string, deadline float64) map[string]any {
	return map[string]any{"checkpoint_id": id, "deadline_ts": deadline}
}

// commitBody is coordination.commit's body: episode_ids always a list.
func commitBody(id, dir string, scope []gym.EpisodeID, stop bool, deadline float64) map[string]any {
	return map[string]any{"checkpoint_id": id, "deadline_ts": deadline, "checkpoint_dir": dir,
		"episode_ids": episodeList(scope), "stop": stop}
}

func restoreBody(id, dir string, scope []gym.EpisodeID, deadline float64) map[string]any {
	return map[string]any{"checkpoint_id": id, "deadline_ts": deadline, "checkpoint_dir": dir,
		"episode_ids": episodeList(scope)}
}

// episodeList is the scope as EpisodeId.model_dump gives it: every field.
func episodeList(ids []gym.EpisodeID) []map[string]any {
	out := make([]map[string]any, len(ids))
	for i, id := range ids {
		out[i] = map[string]any{"rollout_id": id.RolloutID, "attempt": id.Attempt}
	}
	return out
}

// deadlineIn is an absolute deadline_ts d from now.
func deadlineIn(d time.Duration) float64 {
	return float64(time.Now().Add(d).UnixNano()) / 1e9
}

func phaseOf(t *testing.T, r reply, f map[string]json.RawMessage) gym.Phase {
	t.Helper()
	var p gym.Phase
	json.Unmarshal(f["phase"], &p)
	if !slices.Contains(phases, p) {
		t.Errorf("%s: unknown phase %q", r.who, p)
	}
	return p
}

func decode(t *testing.T, r reply, out any) {
	t.Helper()
	if err := json.Unmarshal(r.body, out); err != nil {
		t.Fatalf("%s: %v", r, err)
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// sameJSON reports whether two replies hold the same JSON value.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
