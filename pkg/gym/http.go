package gym

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
)

// MaxBodyBytes bounds a control request body; a scope of many thousand
// episode ids fits well inside it.
const MaxBodyBytes = 32 << 20

// NewHandler serves c's routes under RoutePrefix as Gym's FastAPI router
// does: each route of the routes table (routes.go) at its method, each
// requiring "Authorization: Bearer <token>" (compared in constant time).
// The route is matched first (404, 405), then the token is checked (401),
// and only then is the body read and validated (422, FastAPI's
// {"detail": [...]} shape): a caller without the token gets nothing
// parsed and nothing of its input echoed. Refusals use the error
// envelope, every text capped by CapDetail. An empty token is refused: the
// routes would be open to anyone.
func NewHandler(c *Control, token string) (http.Handler, error) {
	if token == "" {
		return nil, errors.New("checkpoint control routes require a non-empty bearer token")
	}
	return &handler{c: c, want: []byte("Bearer " + token)}, nil
}

type handler struct {
	c    *Control
	want []byte
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op, ok := strings.CutPrefix(r.URL.Path, RoutePrefix+"/")
	route := routeOf[op]
	if !ok || route == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	}
	if r.Method != route.method {
		w.Header().Set("Allow", route.method)
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
		return
	}
	// Before the body is read: an anonymous caller costs no parsing.
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), h.want) != 1 {
		writeError(w, Refuse(ErrUnauthorized, "missing or invalid checkpoint control bearer token"))
		return
	}
	var req any
	if route.method == http.MethodPost {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
		if err != nil {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"detail": CapDetail(err.Error())})
			return
		}
		if req, err = DecodeRequest(op, body); err != nil {
			writeError(w, err)
			return
		}
	}
	reply, err := route.serve(h.c, r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, reply)
}

// writeError answers err: FastAPI's validation shape for a bad body, the
// envelope for everything else.
func writeError(w http.ResponseWriter, err error) {
	status, body := Envelope(err)
	if body.Error.Code == CodeInvalidRequest {
		writeJSON(w, status, ValidationBody{Detail: []ValidationIssue{{Type: "value_error", Loc: []string{"body"}, Msg: body.Error.Detail}}})
		return
	}
	writeJSON(w, status, body)
}

// ValidationBody is FastAPI's 422 answer to a body that fails validation.
type ValidationBody struct {
	Detail []ValidationIssue `json:"detail"`
}

// ValidationIssue is one entry of a ValidationBody.
type ValidationIssue struct {
	Type string   `json:"type"`
	Loc  []string `json:"loc"`
	Msg  string   `json:"msg"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"error":{"code":"internal_error","detail":"reply is not JSON"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(data)
}
