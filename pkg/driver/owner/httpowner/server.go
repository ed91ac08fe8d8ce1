package httpowner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/gym"
)

// Server serves an owner over HTTP as a Gym resources server answers:
// POST /seed_session, /sandbox_access, /verify and /close_session, each
// also under /ng-rollout/<capture key>/, the prefix that binds a call to
// its attempt. With a Control and a Token it is also a checkpoint
// participant: Gym's control routes (gym.NewHandler) under gym.RoutePrefix.
// So tests and users run the same HTTP path a cluster uses.
//
// Who may call what: the session routes but the seed need the session's
// cookie (the owner checks it: an Authenticator is asked before the body is
// read); the control routes need the bearer Token; GET /healthz and GET
// /metrics need nothing (they say nothing of any session). Every error is
// answered in Gym's envelope {"error": {"code", "detail"}}, its detail
// capped by gym.CapDetail.
type Server struct {
	// Owner answers the session calls.
	Owner owner.Owner
	// Control is the owner's checkpoint control plane (owner.NewControl);
	// nil, or an empty Token, serves no control routes (they answer 404:
	// not a participant).
	Control *gym.Control
	// Token is the control routes' bearer token.
	Token string
	// Log receives a line per failed call.
	Log *slog.Logger
	// ClientError classifies an owner error as the caller's fault (HTTP
	// 400), e.g. a malformed body or an unknown session.
	ClientError func(error) bool
	// Metrics, when set, is served at GET /metrics, with a count of the
	// session calls by route and status registered in it
	// (ngdriver_owner_http_requests_total).
	Metrics *prometheus.Registry

	requests *prometheus.CounterVec
}

// Authenticator is an owner that checks a call's credentials (its cookies,
// for the attempt key names) without acting: the server asks it before it
// reads the body of /sandbox_access, /verify or /close_session, so a
// caller without them costs no body read. call is the route's name.
type Authenticator interface {
	Authenticate(call, key string, c owner.Cookies) error
}

// Codes of the owner's own refusals, beside Gym's (gym.Classify); serve
// answers the same classes with the same names.
const (
	CodeBadRequest    = "bad_request"
	CodeNoSandbox     = "no_sandbox"
	CodeSessionClosed = "session_closed"
	CodeCancelled     = "cancelled"
)

// Handler returns the routes.
func (s *Server) Handler() http.Handler {
	if s.Metrics != nil && s.requests == nil {
		s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ngdriver_owner_http_requests_total", Help: "Session calls of the owner by route and status code.",
		}, []string{"route", "code"})
		s.Metrics.MustRegister(s.requests)
	}
	mux := http.NewServeMux()
	for _, prefix := range []string{"", "/ng-rollout/{key}"} {
		mux.HandleFunc("POST "+prefix+"/seed_session", s.counted("seed_session", s.seed))
		mux.HandleFunc("POST "+prefix+"/sandbox_access", s.counted("sandbox_access", s.access))
		mux.HandleFunc("POST "+prefix+"/verify", s.counted("verify", s.verify))
		mux.HandleFunc("POST "+prefix+"/close_session", s.counted("close_session", s.close))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { reply(w, http.StatusOK, map[string]bool{"ok": true}) })
	if s.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.Metrics, promhttp.HandlerOpts{}))
	}
	if s.Control != nil && s.Token != "" {
		if control, err := gym.NewHandler(s.Control, s.Token); err == nil {
			mux.Handle(gym.RoutePrefix+"/", control)
		}
	}
	return mux
}

func cookiesOf(r *http.Request) owner.Cookies {
	c := owner.Cookies{}
	for _, ck := range r.Cookies() {
		c[ck.Name] = ck.Value
	}
	return c
}

// counted counts a session call by route and status when metrics are on.
func (s *Server) counted(route string, h http.HandlerFunc) http.HandlerFunc {
	if s.requests == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h(rec, r)
		s.requests.WithLabelValues(route, strconv.Itoa(rec.status)).Inc()
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// authenticate asks an Authenticator owner whether the call may act, before
// its body is read; false when it answered the refusal.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, call string) bool {
	a, ok := s.Owner.(Authenticator)
	if !ok {
		return true
	}
	if err := a.Authenticate(call, r.PathValue("key"), cookiesOf(r)); err != nil {
		s.fail(w, call, err)
		return false
	}
	return true
}

func body(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	return data, nil
}

func (s *Server) seed(w http.ResponseWriter, r *http.Request) {
	data, err := body(r)
	if err != nil {
		s.fail(w, "seed_session", err)
		return
	}
	var res owner.SeedReply
	if sw, ok := s.Owner.(interface {
		SeedSessionWith(context.Context, string, owner.Cookies, json.RawMessage) (owner.SeedReply, error)
	}); ok {
		res, err = sw.SeedSessionWith(r.Context(), r.PathValue("key"), cookiesOf(r), data)
	} else {
		res, err = s.Owner.SeedSession(r.Context(), r.PathValue("key"), data)
	}
	if err != nil {
		s.fail(w, "seed_session", err)
		return
	}
	for k, v := range res.Cookies {
		http.SetCookie(w, &http.Cookie{Name: k, Value: v, Path: "/", HttpOnly: true})
	}
	if res.Restart {
		w.Header().Set(HeaderRestart, "1")
	}
	if res.VerifyMode != "" {
		w.Header().Set(HeaderVerify, res.VerifyMode)
	}
	out := res.Body
	if len(out) == 0 {
		out = json.RawMessage("{}")
	}
	raw(w, http.StatusOK, out)
}

func (s *Server) access(w http.ResponseWriter, r *http.Request) {
	if !s.authenticate(w, r, "sandbox_access") {
		return
	}
	acc, err := s.Owner.SandboxAccess(r.Context(), r.PathValue("key"), cookiesOf(r))
	if err != nil {
		s.fail(w, "sandbox_access", err)
		return
	}
	reply(w, http.StatusOK, acc)
}

func (s *Server) verify(w http.ResponseWriter, r *http.Request) {
	if !s.authenticate(w, r, "verify") {
		return
	}
	data, err := body(r)
	if err != nil {
		s.fail(w, "verify", err)
		return
	}
	res, err := s.Owner.Verify(r.Context(), r.PathValue("key"), cookiesOf(r), data)
	if err != nil {
		s.fail(w, "verify", err)
		return
	}
	if len(res.Body) > 0 {
		raw(w, http.StatusOK, res.Body)
		return
	}
	reply(w, http.StatusOK, res)
}

func (s *Server) close(w http.ResponseWriter, r *http.Request) {
	if !s.authenticate(w, r, "close_session") {
		return
	}
	if err := s.Owner.CloseSession(r.Context(), r.PathValue("key"), cookiesOf(r)); err != nil {
		s.fail(w, "close_session", err)
		return
	}
	reply(w, http.StatusOK, struct{}{})
}

// classify maps an owner error class to its HTTP status and code, in one
// place: Gym's refusals (a stale attempt, closed admission, a bad capture
// key, a call without its session's cookie) keep Gym's.
func (s *Server) classify(err error) (int, string) {
	if status, code := gym.Classify(err); code != gym.CodeInternal {
		return status, code
	}
	switch {
	case errors.Is(err, owner.ErrNoSandbox):
		return http.StatusNotFound, CodeNoSandbox
	case errors.Is(err, owner.ErrClosed):
		return http.StatusGone, CodeSessionClosed
	case errors.Is(err, context.Canceled):
		return 499, CodeCancelled
	case s.ClientError != nil && s.ClientError(err):
		return http.StatusBadRequest, CodeBadRequest
	}
	return http.StatusInternalServerError, gym.CodeInternal
}

// fail answers an owner error in Gym's envelope, its detail (and the log
// line's) capped by gym.CapDetail.
func (s *Server) fail(w http.ResponseWriter, call string, err error) {
	code, name := s.classify(err)
	detail := gym.CapDetail(err.Error())
	if s.Log != nil {
		s.Log.Warn("owner "+call+" failed", "status", code, "code", name, "error", detail)
	}
	reply(w, code, gym.ErrorBody{Error: gym.ErrorDetail{Code: name, Detail: detail}})
}

func reply(w http.ResponseWriter, code int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		code, data = http.StatusInternalServerError, []byte(`{"error":{"code":"internal_error","detail":"cannot encode the reply"}}`)
	}
	raw(w, code, data)
}

func raw(w http.ResponseWriter, code int, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(data)
}
