// Package serve is `ngdriver serve`: an HTTP server that stands where NeMo
// Gym's sandboxed harness agent stands. POST /run runs one rollout through
// the driver's stage machine, with its identity taken from the body as
// Gym's collector sends it; POST /aggregate_metrics answers as Gym's agents
// do; the checkpoint routes under /ng-control/v1/checkpoint are pkg/gym's
// control plane over the driver's agent participant (bearer token, checked
// before a body is read); /metrics (the driver's figures, the Go runtime's
// and the process's) and /healthz report on it and need no token.
package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/gym"
)

// Server serves one driver's runs and its checkpoint participant.
type Server struct {
	// Runner runs the rollouts; its Participant is the checkpoint side.
	Runner *driver.Runner
	// Token authenticates the control plane (Authorization: Bearer). Empty:
	// checkpointing is off, and the control routes answer 404, which Gym's
	// coordinator reads as "not a participant".
	Token string
	// SkipVerification makes /aggregate_metrics answer empty, as a Gym
	// agent configured with skip_verification does.
	SkipVerification bool
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
func (s *Server) Handler() (http.Handler, error) {
	if s.base == nil {
		s.base, s.cancelBase = context.WithCancelCause(context.Background())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /run", s.handleRun)
	mux.HandleFunc("POST /ng-rollout/{key}/run", s.handleRun)
	mux.HandleFunc("POST /aggregate_metrics", s.handleAggregate)
	if s.Token != "" {
		control, err := gym.NewHandler(s.Runner.Participant.Control(), s.Token)
		if err != nil {
			return nil, err
		}
		mux.Handle(gym.RoutePrefix+"/", s.timed(control))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		st := s.Runner.Participant.Control().Status()
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "phase": st.Phase, "runs": len(s.Runner.Participant.Runs())})
	})
	if s.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.Metrics.Registry, promhttp.HandlerOpts{}))
	}
	return mux, nil
}

// timed counts and times each control call and logs the ones that change
// state.
func (s *Server) timed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.URL.Path, gym.RoutePrefix+"/")
		if !slices.Contains(gym.Ops(), op) {
			op = "other" // no label for whatever a caller puts in a path
		}
		begin := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		if s.Metrics != nil {
			s.Metrics.phase(op, time.Since(begin))
		}
		s.count(op, rec.status)
		if op != gym.OpStatus {
			s.log().Info("checkpoint "+op, "status", rec.status, "took_ms", time.Since(begin).Milliseconds())
		}
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
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

// runIdentity is the attempt a /run belongs to: from the body as Gym's
// rollout_correlation derives it, else from the /ng-rollout/<key>/ prefix.
// When both name one, they must agree.
func runIdentity(r *http.Request, body []byte) (gym.EpisodeID, error) {
	id, err := gym.RunIdentity(body)
	key := r.PathValue("key")
	if key == "" {
		return id, err
	}
	fromPath, perr := gym.ParseCaptureKey(key)
	if perr != nil {
		return gym.EpisodeID{}, gym.Refuse(gym.ErrInvalidRequest, "the path's rollout key %q: %v", driver.Clip(key, 200), perr)
	}
	switch {
	case errors.Is(err, gym.ErrRolloutIDRequired):
		return fromPath, nil
	case err != nil:
		return id, err
	case id != fromPath:
		return gym.EpisodeID{}, gym.Refuse(gym.ErrInvalidRequest, "the path names %s but the body names %s", fromPath.CaptureKey(), id.CaptureKey())
	}
	return id, nil
}

func (s *Server) handleRun(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r)
	if err != nil {
		s.fail(w, "run", err)
		return
	}
	id, err := runIdentity(r, body)
	if err != nil {
		s.fail(w, "run", err)
		return
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.base, func() { cancel(context.Cause(s.base)) })
	defer stop()
	result, err := s.Runner.Run(ctx, driver.RunRequest{RolloutID: id.RolloutID, Attempt: id.Attempt, Body: body})
	if err != nil {
		s.fail(w, "run", fmt.Errorf("run %s: %w", driver.Clip(id.CaptureKey(), 64), err))
		return
	}
	s.count("run", http.StatusOK)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(result)
}

// handleAggregate answers POST /aggregate_metrics as Gym's base agent does:
// computed here from the verify responses, not relayed to the owner.
func (s *Server) handleAggregate(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r)
	if err != nil {
		s.fail(w, "aggregate_metrics", err)
		return
	}
	req, err := gym.DecodeAggregateMetricsRequest(body)
	if err != nil {
		s.fail(w, "aggregate_metrics", err)
		return
	}
	out := gym.EmptyAggregateMetrics()
	if !s.SkipVerification {
		if out, err = gym.ComputeAggregateMetrics(req.VerifyResponses); err != nil {
			s.fail(w, "aggregate_metrics", err)
			return
		}
	}
	s.count("aggregate_metrics", http.StatusOK)
	writeJSON(w, http.StatusOK, out)
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

// Codes of the refusals that are the driver's own, not Gym's checkpoint
// wire: they travel in the same envelope.
const (
	CodeBadRequest  = "bad_request"
	CodeRunInFlight = "run_in_flight"
	// CodeSessionClosed: the owner ended this attempt's session already
	// (its verdict was given, or it was closed): post the next attempt.
	CodeSessionClosed = "session_closed"
	CodeShuttingDown  = "shutting_down"
	CodeCancelled     = "cancelled"
)

// classify maps an error class to its HTTP status and code: the one place
// that does. Gym's refusals keep Gym's status and code.
func classify(err error) (int, string) {
	if status, code := gym.Classify(err); code != gym.CodeInternal {
		return status, code
	}
	switch {
	case errors.Is(err, driver.ErrBadRequest), errors.Is(err, driver.ErrBadBookmark), errors.Is(err, driver.ErrBookmarkVersion):
		return http.StatusBadRequest, CodeBadRequest
	case errors.Is(err, driver.ErrDuplicateRun):
		return http.StatusConflict, CodeRunInFlight
	case errors.Is(err, owner.ErrClosed):
		return http.StatusConflict, CodeSessionClosed
	case errors.Is(err, driver.ErrShuttingDown):
		return http.StatusServiceUnavailable, CodeShuttingDown
	case errors.Is(err, context.Canceled), errors.Is(err, driver.ErrCancelled):
		return 499, CodeCancelled // the client went away, or a retire ended the run
	}
	return http.StatusInternalServerError, gym.CodeInternal
}

// fail answers err in the envelope; its text, in the reply and in the log
// line, is capped by gym.CapDetail, so no input echoed in an error comes
// back (or is logged) whole.
func (s *Server) fail(w http.ResponseWriter, route string, err error) {
	code, name := classify(err)
	s.count(route, code)
	level := slog.LevelWarn
	if code >= 500 {
		level = slog.LevelError
	}
	msg := gym.CapDetail(err.Error())
	s.log().Log(context.Background(), level, route+" failed", "status", code, "code", name, "error", msg)
	writeJSON(w, code, gym.ErrorBody{Error: gym.ErrorDetail{Code: name, Detail: msg}})
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
