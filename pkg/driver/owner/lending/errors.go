package lending

import (
	"encoding/json"
	"errors"
)

// Sentinel errors of the owner. It wraps them with %w and what it was
// doing; callers tell the classes apart with errors.Is (ClientError maps
// them to the caller's fault for the HTTP server).
var (
	// ErrSessionCookie is a call on a session without that session's
	// cookie (none, a wrong secret, or another session's). It is refused as
	// gym.ErrUnauthorized (401 unauthorized); it names no session.
	ErrSessionCookie = errors.New("no valid session cookie")
	// ErrUnknownSession means the cookies name no session of this owner
	// (or no session at all).
	ErrUnknownSession = errors.New("unknown session")
	// ErrBadRunBody is a run body the owner cannot seed a session from:
	// not a JSON object, a known field of the wrong type, a file path
	// outside the workdir. Nothing was created.
	ErrBadRunBody = errors.New("bad run body")
	// ErrBadVerifyBody is a verify body that is not a JSON object. The
	// session is left as it was.
	ErrBadVerifyBody = errors.New("bad verify body")
)

// ClientError reports whether err, returned by the owner, is the
// caller's fault (answered 400 bad_request by httpowner.Server): an
// unknown session, a bad run or verify body, or a body that is not JSON.
func ClientError(err error) bool {
	var se *json.SyntaxError
	return errors.Is(err, ErrUnknownSession) || errors.Is(err, ErrBadRunBody) ||
		errors.Is(err, ErrBadVerifyBody) || errors.As(err, &se)
}
