// Package serve is `ngdriver serve`: an HTTP server that stands where the
// rollout framework's sandboxed harness agent stands. POST /run runs one
// rollout through the driver's stage machine; the checkpoint control plane
// (/ng-control/v1/checkpoint/...) parks, exports, commits, resumes and
// restores runs; /metrics and /healthz report on it.
package serve

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ngharness/ngharness/pkg/driver"
)

// Server serves one driver's runs and its checkpoint participant.
type Server struct {
	// Runner runs the rollouts; its Participant is the checkpoint side.
	Runner *driver.Runner
	// Name names this participant in the records files it writes.
	Name string
	// Token authenticates the control plane (Authorization: Bearer).
	Token string
	// Metrics, if set, is served at /metrics.
	Metrics *Metrics
	// Log receives one line per request that changes state.
	Log *slog.Logger

	base       context.Context // cancelled (cause ErrShuttingDown) to park what runs
	cancelBase context.CancelCauseFunc
}

// maxBody bounds a request body.
const maxBody = 64 << 20

// Handler returns the server's routes.
func (s *Server) Handler() http.Handler {
	if s.base == nil {
		s.base, s.cancelBase = context.WithCancelCause(context.Background())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /run", s.handleRun)
	mux.HandleFunc("POST /ng-rollout/{rollout}/run", s.handleRun)
	for _, call := range []string{"prepare", "commit", "resume", "restore", "retire"} {
		mux.HandleFunc("POST /ng-control/v1/checkpoint/"+call, s.control(call))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "phase": s.Runner.Participant.Phase(), "runs": len(s.Runner.Participant.Runs())})
	})
	if s.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.Metrics.Registry, promhttp.HandlerOpts{}))
	}
	return mux
}

// ParkAll ends the runs still in flight for a shutdown: each is cancelled
// with cause driver.ErrShuttingDown, which leaves its launch and session to
// the checkpoint instead of cleaning them up.
func (s *Server) ParkAll() {
	if s.cancelBase != nil {
		s.cancelBase(driver.ErrShuttingDown)
	}
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// attemptSuffix splits "<id>-a<N>" as the framework's rollout prefix names
// an attempt.
var attemptSuffix = regexp.MustCompile(`^(.+)-a([0-9]+)$`)

func (s *Server) handleRun(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r)
	if err != nil {
		s.fail(w, "run", err)
		return
	}
	var fields struct {
		RolloutID string `json:"rollout_id"`
		Attempt   int    `json:"attempt"`
	}
	if err := json.Unmarshal(body, &fields); err != nil {
		s.fail(w, "run", fmt.Errorf("%w: the body is not a JSON object: %v", driver.ErrBadRequest, err))
		return
	}
	req := driver.RunRequest{RolloutID: fields.RolloutID, Attempt: fields.Attempt, Body: body}
	if p := r.PathValue("rollout"); p != "" {
		req.RolloutID = p
		// "<id>-a<N>" is attempt N of <id>, unless the body's rollout_id
		// is the whole word (an id may itself end in -a<digits>).
		if m := attemptSuffix.FindStringSubmatch(p); m != nil && p != fields.RolloutID {
			req.RolloutID = m[1]
			req.Attempt, _ = strconv.Atoi(m[2])
		}
	}
	if req.RolloutID == "" {
		s.fail(w, "run", fmt.Errorf("%w: no rollout id (in the path /ng-rollout/<id>/run or the body's rollout_id)", driver.ErrBadRequest))
		return
	}
	if err := driver.ValidateRolloutID(req.RolloutID); err != nil {
		s.fail(w, "run", err)
		return
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.base, func() { cancel(context.Cause(s.base)) })
	defer stop()
	result, err := s.Runner.Run(ctx, req)
	if err != nil {
		s.fail(w, "run", fmt.Errorf("run %s: %w", req.RolloutID, err))
		return
	}
	s.count("run", http.StatusOK)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(result)
}

func readBody(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read the body: %v", driver.ErrBadRequest, err)
	}
	if len(data) > maxBody {
		return nil, fmt.Errorf("%w: the body is larger than %d bytes", driver.ErrBadRequest, maxBody)
	}
	return data, nil
}

// checkpointRequest is the body of every control call.
type checkpointRequest struct {
	CheckpointID  string   `json:"checkpoint_id"`
	DeadlineTS    float64  `json:"deadline_ts"`
	CheckpointDir string   `json:"checkpoint_dir"`
	EpisodeIDs    []string `json:"episode_ids"`
	Stop          bool     `json:"stop"`
}

// errUnauthorized: a wrong or missing bearer token.
var errUnauthorized = errors.New("unauthorized")

func (s *Server) authorized(r *http.Request) bool {
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || s.Token == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(s.Token)) == 1
}

func (s *Server) control(call string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			s.fail(w, call, fmt.Errorf("%w: a bearer token is required and must match", errUnauthorized))
			return
		}
		body, err := readBody(r)
		if err != nil {
			s.fail(w, call, err)
			return
		}
		// Fields this build does not know are ignored: the framework may
		// add some; the ones read here are checked.
		var req checkpointRequest
		if err := json.Unmarshal(body, &req); err != nil {
			s.fail(w, call, fmt.Errorf("%w: %s body: %v", driver.ErrBadRequest, call, err))
			return
		}
		if req.CheckpointID == "" {
			s.fail(w, call, fmt.Errorf("%w: %s needs a checkpoint_id", driver.ErrBadRequest, call))
			return
		}
		begin := time.Now()
		reply, err := s.do(r.Context(), call, req)
		if s.Metrics != nil {
			s.Metrics.phase(call, time.Since(begin))
		}
		if err != nil {
			s.fail(w, call, err)
			return
		}
		s.log().Info("checkpoint "+call, "checkpoint", driver.Clip(req.CheckpointID, 200), "took_ms", time.Since(begin).Milliseconds())
		s.count(call, http.StatusOK)
		writeJSON(w, http.StatusOK, reply)
	}
}

func (s *Server) do(ctx context.Context, call string, req checkpointRequest) (any, error) {
	p := s.Runner.Participant
	switch call {
	case "prepare":
		deadline := time.Now().Add(5 * time.Minute)
		if req.DeadlineTS > 0 {
			deadline = time.Unix(0, int64(req.DeadlineTS*1e9))
		}
		return p.Prepare(ctx, req.CheckpointID, deadline)
	case "commit":
		return s.commit(ctx, req)
	case "resume":
		return map[string]any{"checkpoint_id": req.CheckpointID, "resumed": true}, p.Resume(req.CheckpointID)
	case "restore":
		if err := p.CanRestore(); err != nil {
			return nil, err
		}
		recs, err := driver.ReadRecords(req.CheckpointDir, s.Name, req.CheckpointID)
		if err != nil {
			return nil, err
		}
		recs = filterEpisodes(recs, req.EpisodeIDs)
		if err := p.Restore(req.CheckpointID, recs); err != nil {
			return nil, err
		}
		return map[string]any{"checkpoint_id": req.CheckpointID, "restored": len(recs)}, nil
	case "retire":
		return map[string]any{"checkpoint_id": req.CheckpointID, "retired": true}, p.Retire(req.CheckpointID)
	}
	return nil, fmt.Errorf("%w: unknown call %s", driver.ErrBadRequest, call)
}

// commit writes the prepared export durably, then commits (killing the
// exported launches with stop, only after the write is durable).
func (s *Server) commit(ctx context.Context, req checkpointRequest) (any, error) {
	p := s.Runner.Participant
	recs, err := p.Exported(req.CheckpointID)
	if err != nil {
		return nil, err
	}
	recs = filterEpisodes(recs, req.EpisodeIDs)
	path, err := driver.WriteRecords(req.CheckpointDir, s.Name, req.CheckpointID, recs)
	if err != nil {
		return nil, err
	}
	if _, err := p.Commit(ctx, req.CheckpointID, req.Stop); err != nil {
		return nil, err
	}
	return map[string]any{"checkpoint_id": req.CheckpointID, "records": len(recs), "path": path, "stopped": req.Stop}, nil
}

// filterEpisodes keeps the records of the given rollouts (all when none).
func filterEpisodes(recs []driver.Record, ids []string) []driver.Record {
	if len(ids) == 0 {
		return recs
	}
	keep := map[string]bool{}
	for _, id := range ids {
		keep[id] = true
	}
	out := []driver.Record{}
	for _, r := range recs {
		if keep[r.RolloutID] {
			out = append(out, r)
		}
	}
	return out
}

// status maps an error class to its HTTP status: the one place that does.
func status(err error) int {
	switch {
	case errors.Is(err, errUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, driver.ErrBadRequest), errors.Is(err, driver.ErrBadBookmark), errors.Is(err, driver.ErrBookmarkVersion):
		return http.StatusBadRequest
	case errors.Is(err, driver.ErrBadRecords):
		return http.StatusUnprocessableEntity
	case errors.Is(err, driver.ErrPhase), errors.Is(err, driver.ErrDuplicateRun), errors.Is(err, driver.ErrRunsInFlight):
		return http.StatusConflict
	case errors.Is(err, driver.ErrShuttingDown):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, driver.ErrCancelled):
		return 499 // the client went away
	}
	return http.StatusInternalServerError
}

// maxErrorText bounds the error text of a reply and its log line, so no
// input echoed in an error comes back (or is logged) whole.
const maxErrorText = 4 << 10

func (s *Server) fail(w http.ResponseWriter, route string, err error) {
	code := status(err)
	s.count(route, code)
	level := slog.LevelWarn
	if code >= 500 {
		level = slog.LevelError
	}
	msg := err.Error()
	if len(msg) > maxErrorText {
		msg = fmt.Sprintf("%s... (%d bytes cut)", strings.ToValidUTF8(msg[:maxErrorText], ""), len(msg)-maxErrorText)
	}
	s.log().Log(context.Background(), level, route+" failed", "status", code, "error", msg)
	writeJSON(w, code, map[string]string{"error": msg})
}

func (s *Server) count(route string, code int) {
	if s.Metrics != nil {
		s.Metrics.httpRequests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}
