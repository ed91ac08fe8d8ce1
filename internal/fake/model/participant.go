package model

// The fake model as NeMo Gym's policy model participant (kind "model"), so
// a Gym deployment built around it passes Gym's discover, which refuses a
// deployment with no policy model taking part. Opt-in: Options.Checkpoint.
//
// It follows nemo_gym/_checkpoint/model.py of NVIDIA-NeMo/Gym at
// b58bb4f1f360342ec41aab879e78464e0ff5e3ad, the stored version whose
// participant matches control.py at 011c3386d691 (RetiredAttempts, install
// with the restore's scope, delete_restored): PolicyGate and
// PolicyModelParticipant, with a capture ledger of its own and no
// generation cuts (the fake stages no tokens). The control plane, the
// routes, the retire marks and the store are pkg/gym's (gym.NewControl,
// gym.NewHandler), as `ngdriver serve` and `ngdriver owner serve` use them.
//
// The gate, on every generation route (chat completions, Responses,
// Messages, with or without the /ng-rollout/<capture key>/ prefix):
//
//   - a call of a retired attempt is refused (409 stale_attempt); a prefix
//     that is not a capture key is refused (422 invalid_request, ours:
//     Gym's code for it is in an errors.py that is not stored);
//   - while a checkpoint has admission closed, a new call waits for the
//     resume before it is admitted (so it never holds up a prepare);
//   - an admitted call runs, but its response is held until the resume
//     unless it had started before admission closed; a response that has
//     started is "streaming" and blocks the prepare until it ends.
//
// Records are Gym's ModelRecord {episode_id, rows, generation_cuts}: the
// ledger rows of one continued episode. The fake's ledger holds one row,
// {"model_call_id": ...}, for each call of an attempt whose response was
// delivered; an undelivered call has none, so a restored agent sends it
// again, as Gym leaves an undelivered call's rows out.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/gym"
)

// DefaultInstance is the participant instance of a fake model whose
// Checkpoint names none: the name Gym's configs give the policy model
// entry.
const DefaultInstance = "policy_model"

// DefaultLeaseGrace is Gym's default lease_grace_seconds.
const DefaultLeaseGrace = 600 * time.Second

// Checkpoint makes the server a checkpoint participant of kind "model".
type Checkpoint struct {
	// Token is the bearer token of the control routes (Gym's
	// checkpoint.control_auth_token); required.
	Token string
	// Instance is the participant instance (default DefaultInstance): its
	// records live under <checkpoint_dir>/gym/model/<Instance>.
	Instance string
	// LeaseGrace is Gym's lease_grace_seconds (default DefaultLeaseGrace).
	LeaseGrace time.Duration
}

// policy is the model participant: the gate in front of the generation
// routes and the capture ledger. It implements gym.Participant.
type policy struct {
	ctl *gym.Control

	mu        sync.Mutex
	accepting bool
	// wake is closed, and replaced, when admission reopens or an attempt is
	// retired: calls waiting to be admitted or delivered look again.
	wake    chan struct{}
	tickets map[*ticket]bool
	// served: a call was admitted since the process started; a restore
	// then refuses, as a ledger this process wrote may belong to a live
	// episode.
	served bool
	seq    int
	// waiting counts the calls waiting to be admitted and the responses
	// held, while admission is closed (the tests see a call arrive by it).
	waiting int
	// ledger holds each attempt's rows by capture key.
	ledger map[string][]json.RawMessage
	// restoredTargets are the attempts a restore continues that no call
	// has reached yet; restoredCuts their restored generation cuts.
	restoredTargets map[string]bool
	restoredCuts    map[string]json.RawMessage
}

// ticket is one admitted generation call.
type ticket struct {
	key     string // its capture key; "" for a call without the prefix
	cancel  context.CancelFunc
	done    chan struct{}
	started bool // its response has started
}

func newPolicy() *policy {
	return &policy{
		accepting: true, wake: make(chan struct{}), tickets: map[*ticket]bool{},
		ledger: map[string][]json.RawMessage{}, restoredTargets: map[string]bool{}, restoredCuts: map[string]json.RawMessage{},
	}
}

// wakeLocked wakes every waiting call (p.mu held).
func (p *policy) wakeLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// covers reports whether retiring id discards the attempt of key.
func covers(id gym.EpisodeID, key string) bool {
	other, err := gym.ParseCaptureKey(key)
	return err == nil && other.RolloutID == id.RolloutID && other.Attempt <= id.Attempt
}

// enter admits a call of key (hasKey: the path carries the prefix): it
// waits while admission is closed, refuses a retired attempt, and tracks
// the call. The ticket's context ends when the call is retired.
func (p *policy) enter(ctx context.Context, key string, hasKey bool) (*ticket, context.Context, error) {
	var id gym.EpisodeID
	if hasKey {
		var err error
		if id, err = gym.ParseCaptureKey(key); err != nil {
			return nil, nil, err
		}
	}
	for {
		p.mu.Lock()
		if hasKey {
			if err := p.ctl.CheckAttempt(id); err != nil {
				p.mu.Unlock()
				return nil, nil, err
			}
		}
		if p.accepting {
			tctx, cancel := context.WithCancel(ctx)
			t := &ticket{key: key, cancel: cancel, done: make(chan struct{})}
			p.tickets[t] = true
			p.served = true
			delete(p.restoredTargets, key)
			p.mu.Unlock()
			return t, tctx, nil
		}
		wake := p.wake
		p.waiting++
		p.mu.Unlock()
		var err error
		select {
		case <-wake:
		case <-ctx.Done():
			err = ctx.Err()
		}
		p.mu.Lock()
		p.waiting--
		p.mu.Unlock()
		if err != nil {
			return nil, nil, err
		}
	}
}

// deliver lets t's response start, holding it while admission is closed,
// and records the call in its attempt's ledger. It fails when t was
// retired or its client went away meanwhile.
func (p *policy) deliver(ctx context.Context, t *ticket) error {
	for {
		p.mu.Lock()
		if err := ctx.Err(); err != nil {
			p.mu.Unlock()
			return err
		}
		if p.accepting {
			t.started = true
			if t.key != "" {
				p.seq++
				row, _ := json.Marshal(map[string]string{"model_call_id": fmt.Sprintf("fakemodel-%d", p.seq)})
				p.ledger[t.key] = append(p.ledger[t.key], row)
			}
			p.mu.Unlock()
			p.ctl.Notify()
			return nil
		}
		wake := p.wake
		p.waiting++
		p.mu.Unlock()
		p.ctl.Notify()
		select {
		case <-wake:
		case <-ctx.Done():
		}
		p.mu.Lock()
		p.waiting--
		p.mu.Unlock()
	}
}

// exit ends t's tracking.
func (p *policy) exit(t *ticket) {
	p.mu.Lock()
	delete(p.tickets, t)
	p.mu.Unlock()
	t.cancel()
	close(t.done)
	p.ctl.Notify()
}

// Kind implements gym.Participant.
func (p *policy) Kind() string { return gym.KindModel }

// CloseAdmission implements gym.Participant: new calls wait, responses are
// held.
func (p *policy) CloseAdmission(ctx context.Context, req gym.Request) error {
	p.mu.Lock()
	p.accepting = false
	p.mu.Unlock()
	return nil
}

// OpenAdmission implements gym.Participant: waiting calls are admitted and
// held responses delivered.
func (p *policy) OpenAdmission(ctx context.Context) error {
	p.mu.Lock()
	p.accepting = true
	p.wakeLocked()
	p.mu.Unlock()
	return nil
}

// Readiness implements gym.Participant as Gym's merge_reports of one gate:
// ready once no response is streaming; the streaming calls' capture keys
// are the blockers; counts inflight, held, and the cuts (always 0 here).
func (p *policy) Readiness() gym.Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	streaming := map[string]bool{}
	held := 0
	for t := range p.tickets {
		if t.started {
			streaming[t.key] = true
		} else {
			held++
		}
	}
	keys := make([]string, 0, len(streaming))
	for k := range streaming {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	counts := map[string]int{"inflight": len(p.tickets), "held": held, "cut": 0, "cut_failed": 0, "cut_skipped": 0}
	return gym.NewReport(len(keys) == 0, keys, counts, nil)
}

// modelRecord is Gym's ModelRecord, field for field.
type modelRecord struct {
	EpisodeID      gym.EpisodeID     `json:"episode_id"`
	Rows           json.RawMessage   `json:"rows"`
	GenerationCuts []json.RawMessage `json:"generation_cuts"`
}

// Export implements gym.Participant: a record for each episode of the
// scope whose attempt has ledger rows or a restored cut. A commit without
// a scope is refused, as Gym's model commit is.
func (p *policy) Export(ctx context.Context, scope []gym.EpisodeID) ([]gym.Record, error) {
	if scope == nil {
		return nil, gym.Refuse(gym.ErrRefused, "model commit needs the episode_ids the controller continues from this checkpoint")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []gym.Record
	for _, id := range scope {
		key := id.CaptureKey()
		rows := p.ledger[key]
		cuts := []json.RawMessage{}
		if c, ok := p.restoredCuts[key]; ok {
			cuts = append(cuts, c)
		}
		if len(rows) == 0 && len(cuts) == 0 {
			continue
		}
		list, err := json.Marshal(rows)
		if err != nil {
			return nil, err
		}
		rec, err := gym.NewRecord(modelRecord{EpisodeID: id, Rows: list, GenerationCuts: cuts})
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// decodeModelRecord reads one stored record as Gym's ModelRecord does: the
// three fields and no other (extra="forbid"), rows present, at most one
// generation cut, each an object of GenerationCutRecord's fields. The
// ledger takes rows only as a list of objects.
func decodeModelRecord(r gym.Record) (modelRecord, error) {
	key := r.EpisodeID.CaptureKey()
	dec := json.NewDecoder(bytes.NewReader(r.JSON))
	dec.DisallowUnknownFields()
	var m modelRecord
	if err := dec.Decode(&m); err != nil {
		return m, gym.Refuse(gym.ErrCheckpointState, "model record of episode %s is invalid: %v", key, err)
	}
	if len(m.Rows) == 0 || string(m.Rows) == "null" {
		return m, gym.Refuse(gym.ErrCheckpointState, "model record of episode %s has no rows", key)
	}
	for _, c := range m.GenerationCuts {
		var cut struct {
			ModelCallID   *string          `json:"model_call_id"`
			RequestDigest *string          `json:"request_digest"`
			Continuation  *json.RawMessage `json:"continuation"`
		}
		cd := json.NewDecoder(bytes.NewReader(c))
		cd.DisallowUnknownFields()
		if err := cd.Decode(&cut); err != nil || cut.ModelCallID == nil || cut.RequestDigest == nil || cut.Continuation == nil {
			return m, gym.Refuse(gym.ErrCheckpointState, "model record of episode %s has a generation cut that is not one", key)
		}
	}
	if len(m.GenerationCuts) > 1 {
		return m, gym.Refuse(gym.ErrRefused, "episode %s has more than one undelivered cut", key)
	}
	var rows []map[string]json.RawMessage
	if err := json.Unmarshal(m.Rows, &rows); err != nil {
		return m, gym.Refuse(gym.ErrRefused, "capture ledger refused the restore: the rows of episode %s are not a list of objects", key)
	}
	return m, nil
}

// Install implements gym.Participant: only in a freshly started server
// (one that has served no call); every record is checked first, then the
// rows of each go to the ledger of its next attempt, an episode of the
// scope without a record gets an empty ledger there (clearing what a dead
// execution left), the next attempts of the scope are the restored
// targets, and the ledgers of the scope's own attempts and earlier ones
// are dropped.
func (p *policy) Install(ctx context.Context, records []gym.Record, scope []gym.EpisodeID) error {
	p.mu.Lock()
	served := p.served
	p.mu.Unlock()
	if served {
		return gym.Refuse(gym.ErrRefused, "model restore requires a freshly started model server; this one has served calls")
	}
	decoded := make([]modelRecord, len(records))
	for i, r := range records {
		m, err := decodeModelRecord(r)
		if err != nil {
			return err
		}
		decoded[i] = m
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	recorded := map[string]bool{}
	for _, m := range decoded {
		target := m.EpisodeID.Next().CaptureKey()
		recorded[m.EpisodeID.CaptureKey()] = true
		var rows []json.RawMessage
		json.Unmarshal(m.Rows, &rows)
		p.ledger[target] = rows
		if len(m.GenerationCuts) == 1 {
			p.restoredCuts[target] = m.GenerationCuts[0]
		}
	}
	p.restoredTargets = map[string]bool{}
	for _, id := range scope {
		target := id.Next().CaptureKey()
		if !recorded[id.CaptureKey()] {
			delete(p.ledger, target)
		}
		p.restoredTargets[target] = true
		for a := 0; a <= id.Attempt; a++ {
			delete(p.ledger, gym.EpisodeID{RolloutID: id.RolloutID, Attempt: a}.CaptureKey())
		}
	}
	return nil
}

// Retire implements gym.Participant: the attempt's calls and every
// earlier attempt's are cancelled and waited for; then their restored
// state and ledgers are dropped.
func (p *policy) Retire(ctx context.Context, id gym.EpisodeID) error {
	p.mu.Lock()
	p.wakeLocked() // waiting calls of the attempt look again, and are refused
	var calls []*ticket
	for t := range p.tickets {
		if t.key != "" && covers(id, t.key) {
			calls = append(calls, t)
		}
	}
	p.mu.Unlock()
	for _, t := range calls {
		t.cancel()
	}
	for _, t := range calls {
		select {
		case <-t.done:
		case <-ctx.Done():
			return fmt.Errorf("cannot retire %s in the fake model: a call did not end: %w", id, ctx.Err())
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.restoredTargets {
		if covers(id, k) {
			delete(p.restoredTargets, k)
		}
	}
	for k := range p.restoredCuts {
		if covers(id, k) {
			delete(p.restoredCuts, k)
		}
	}
	for a := 0; a <= id.Attempt; a++ {
		delete(p.ledger, gym.EpisodeID{RolloutID: id.RolloutID, Attempt: a}.CaptureKey())
	}
	return nil
}

// ParkExported implements gym.Participant: the model holds nothing
// outside the process.
func (p *policy) ParkExported(ctx context.Context, records []gym.Record) error { return nil }

// RestoredPending implements gym.RestoredKeeper: the restored attempts no
// call has reached yet.
func (p *policy) RestoredPending(ctx context.Context) ([]gym.EpisodeID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, 0, len(p.restoredTargets))
	for k := range p.restoredTargets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]gym.EpisodeID, 0, len(keys))
	for _, k := range keys {
		id, err := gym.ParseCaptureKey(k)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, nil
}

// DeleteRestored implements gym.RestoredKeeper: the restored state of an
// attempt the controller no longer continues goes, leaving no fence.
func (p *policy) DeleteRestored(ctx context.Context, id gym.EpisodeID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := id.CaptureKey()
	delete(p.restoredTargets, key)
	delete(p.restoredCuts, key)
	delete(p.ledger, key)
	return nil
}

// StatusExtra implements gym.StatusExtender: Gym's model status adds the
// capture keys holding a restored generation cut.
func (p *policy) StatusExtra() map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, 0, len(p.restoredCuts))
	for k := range p.restoredCuts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return map[string]any{"restored_generation_cuts": keys}
}

// CommitReply implements gym.CommitReplier: the staged token-store keys
// the checkpointed episodes still name, in all and by episode (the fake
// stages none, so both are empty unless restored rows carry some).
func (p *policy) CommitReply(records []gym.Record) map[string]any {
	all := []string{}
	byEpisode := map[string][]string{}
	for _, r := range records {
		keys := []string{}
		var m struct {
			Rows []struct {
				StagingKey string `json:"staging_key"`
			} `json:"rows"`
			GenerationCuts []struct {
				Continuation struct {
					StagingKeys []string `json:"staging_keys"`
				} `json:"continuation"`
			} `json:"generation_cuts"`
		}
		json.Unmarshal(r.JSON, &m)
		for _, row := range m.Rows {
			if row.StagingKey != "" {
				keys = append(keys, row.StagingKey)
			}
		}
		for _, c := range m.GenerationCuts {
			keys = append(keys, c.Continuation.StagingKeys...)
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
		byEpisode[r.EpisodeID.CaptureKey()] = keys
		all = append(all, keys...)
	}
	slices.Sort(all)
	return map[string]any{"staging_keys": slices.Compact(all), "staging_keys_by_episode": byEpisode}
}

// gatedWriter holds a response until the gate lets it start: the first
// header, body byte or flush waits in deliver. A call retired (or whose
// client went away) meanwhile is cut off without a reply.
type gatedWriter struct {
	http.ResponseWriter
	p         *policy
	t         *ticket
	ctx       context.Context
	delivered bool
}

func (g *gatedWriter) gate() {
	if g.delivered {
		return
	}
	if err := g.p.deliver(g.ctx, g.t); err != nil {
		panic(http.ErrAbortHandler)
	}
	g.delivered = true
}

func (g *gatedWriter) WriteHeader(code int) {
	g.gate()
	g.ResponseWriter.WriteHeader(code)
}

func (g *gatedWriter) Write(b []byte) (int, error) {
	g.gate()
	return g.ResponseWriter.Write(b)
}

// FlushError lets http.ResponseController flush through the gate.
func (g *gatedWriter) FlushError() error {
	g.gate()
	return http.NewResponseController(g.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the writer underneath.
func (g *gatedWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// gated puts a generation route behind the participant's gate.
func (s *Server) gated(next http.HandlerFunc) http.HandlerFunc {
	if s.policy == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("rollout")
		t, ctx, err := s.policy.enter(r.Context(), key, key != "")
		if err != nil {
			if r.Context().Err() != nil {
				s.logf("fakemodel: %s: the client went away while admission was closed", r.URL.Path)
				return
			}
			status, body := gym.Envelope(err)
			s.logf("fakemodel: %s: refused: %s", r.URL.Path, body.Error.Code)
			writeJSONBody(w, status, body)
			return
		}
		defer s.policy.exit(t)
		gw := &gatedWriter{ResponseWriter: w, p: s.policy, t: t, ctx: ctx}
		next(gw, r.WithContext(ctx))
		if !gw.delivered && ctx.Err() != nil && r.Context().Err() == nil {
			// Retired before its reply: cut off, as Gym cancels the call.
			s.logf("fakemodel: %s: retired before its reply", r.URL.Path)
			panic(http.ErrAbortHandler)
		}
	}
}
