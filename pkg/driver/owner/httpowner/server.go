package httpowner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"

	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/gym"
)

// Server serves an owner over HTTP as a Gym resources server answers:
// POST /seed_session, /sandbox_access, /verify and /close_session, each
// also under /ng-rollout/<capture key>/, the prefix that binds a call to
// its attempt. With a Control and a Token it is also a checkpoint
// participant: Gym's control routes (gym.NewHandler) under gym.RoutePrefix.
// So tests and users run the same HTTP path a cluster uses.
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
}

// Handler returns the routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, prefix := range []string{"", "/ng-rollout/{key}"} {
		mux.HandleFunc("POST "+prefix+"/seed_session", s.seed)
		mux.HandleFunc("POST "+prefix+"/sandbox_access", s.access)
		mux.HandleFunc("POST "+prefix+"/verify", s.verify)
		mux.HandleFunc("POST "+prefix+"/close_session", s.close)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { reply(w, http.StatusOK, map[string]bool{"ok": true}) })
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
	acc, err := s.Owner.SandboxAccess(r.Context(), r.PathValue("key"), cookiesOf(r))
	if err != nil {
		s.fail(w, "sandbox_access", err)
		return
	}
	reply(w, http.StatusOK, acc)
}

func (s *Server) verify(w http.ResponseWriter, r *http.Request) {
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
	if err := s.Owner.CloseSession(r.Context(), r.PathValue("key"), cookiesOf(r)); err != nil {
		s.fail(w, "close_session", err)
		return
	}
	reply(w, http.StatusOK, struct{}{})
}

// code maps an owner error class to its HTTP status, in one place.
func (s *Server) code(err error) int {
	switch {
	case errors.Is(err, owner.ErrNoSandbox):
		return http.StatusNotFound
	case errors.Is(err, owner.ErrClosed):
		return http.StatusGone
	case errors.Is(err, context.Canceled):
		return 499
	case s.ClientError != nil && s.ClientError(err):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// fail answers an owner error. A refusal of Gym's checkpoint wire (a
// stale attempt, closed admission, a bad capture key) is answered in Gym's
// error envelope; the others as {"error": text} with the status code says.
func (s *Server) fail(w http.ResponseWriter, call string, err error) {
	code := s.code(err)
	var body any = map[string]string{"error": err.Error()}
	if status, _ := gym.Classify(err); status != http.StatusInternalServerError {
		code, body = gym.Envelope(err)
	}
	if s.Log != nil {
		s.Log.Warn("owner "+call+" failed", "status", code, "error", err.Error())
	}
	reply(w, code, body)
}

func reply(w http.ResponseWriter, code int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		code, data = http.StatusInternalServerError, []byte(`{"error":"encode reply"}`)
	}
	raw(w, code, data)
}

func raw(w http.ResponseWriter, code int, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(data)
}
