package gym

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"strings"
)

// The refusals of Gym's checkpoint wire (nemo_gym/_checkpoint/errors.py).
// Every error this package returns wraps exactly one of them, so a caller
// maps any error to its HTTP status and code with Classify, in one switch.
// An error's own text is the detail that goes on the wire.
var (
	// ErrRefused is Gym's ControlError base: a participant refusal with no
	// more specific code (409 checkpoint_error).
	ErrRefused = errors.New("checkpoint refused")
	// ErrStaleCheckpoint: the checkpoint id was resumed already; a delayed
	// call of a stale controller must not reopen or overwrite anything (409).
	ErrStaleCheckpoint = errors.New("stale checkpoint")
	// ErrCheckpointConflict: another checkpoint id is active, or the same id
	// is being written to another folder or scope (409).
	ErrCheckpointConflict = errors.New("checkpoint conflict")
	// ErrInvalidPhase: the operation is not allowed in the current phase (409).
	ErrInvalidPhase = errors.New("invalid phase")
	// ErrDeadlineExceeded: the request's deadline_ts passed before or during
	// the operation (409).
	ErrDeadlineExceeded = errors.New("deadline exceeded")
	// ErrStaleAttempt: the attempt was retired (or superseded) and stays
	// refused until the controller forgets its rollout (409).
	ErrStaleAttempt = errors.New("stale attempt")
	// ErrCheckpointParked: admission is closed for a checkpoint, so new work
	// is refused (409; Gym's AdmissionClosedError, code checkpoint_parked at
	// errors.py 14f23fa, renamed admission_closed in later versions).
	ErrCheckpointParked = errors.New("checkpoint parked")
	// ErrRestartInScope: a commit scope names an episode this participant
	// reported as a restart; continuing it would resume a rollout whose other
	// parts start over (409).
	ErrRestartInScope = errors.New("restart in scope")
	// ErrRolloutIDRequired: agent work without a rollout id, which a
	// checkpoint could neither record nor retire (400).
	ErrRolloutIDRequired = errors.New("rollout id required")
	// ErrUnauthorized: missing or wrong control bearer token (401).
	ErrUnauthorized = errors.New("unauthorized")
	// ErrCheckpointState: a participant folder is missing, corrupt,
	// unreadable or unwritable, or holds another checkpoint (422).
	ErrCheckpointState = errors.New("invalid checkpoint state")
	// ErrInvalidRequest: a body that fails validation; Gym (FastAPI) answers
	// it with 422 and FastAPI's own {"detail": [...]} shape, not the envelope.
	ErrInvalidRequest = errors.New("invalid request")
)

// Codes on the wire, as errors.py names them.
const (
	CodeRefused           = "checkpoint_error"
	CodeStaleCheckpoint   = "stale_checkpoint"
	CodeConflict          = "checkpoint_conflict"
	CodeInvalidPhase      = "invalid_phase"
	CodeDeadlineExceeded  = "deadline_exceeded"
	CodeStaleAttempt      = "stale_attempt"
	CodeCheckpointParked  = "checkpoint_parked"
	CodeRestartInScope    = "restart_in_scope"
	CodeRolloutIDRequired = "rollout_id_required"
	CodeUnauthorized      = "unauthorized"
	CodeCheckpointState   = "invalid_checkpoint_state"
	// CodeInvalidRequest is ours: FastAPI's 422 carries no code.
	CodeInvalidRequest = "invalid_request"
	// CodeInternal is ours: Gym answers an unexpected exception with a bare 500.
	CodeInternal = "internal_error"
)

// Classify maps an error to the HTTP status and code Gym answers it with.
// It is the one place that knows the table; an error that wraps none of
// the sentinels is an internal error (500).
func Classify(err error) (status int, code string) {
	switch {
	case errors.Is(err, ErrStaleCheckpoint):
		return http.StatusConflict, CodeStaleCheckpoint
	case errors.Is(err, ErrCheckpointConflict):
		return http.StatusConflict, CodeConflict
	case errors.Is(err, ErrInvalidPhase):
		return http.StatusConflict, CodeInvalidPhase
	case errors.Is(err, ErrDeadlineExceeded):
		return http.StatusConflict, CodeDeadlineExceeded
	case errors.Is(err, ErrStaleAttempt):
		return http.StatusConflict, CodeStaleAttempt
	case errors.Is(err, ErrCheckpointParked):
		return http.StatusConflict, CodeCheckpointParked
	case errors.Is(err, ErrRestartInScope):
		return http.StatusConflict, CodeRestartInScope
	case errors.Is(err, ErrRefused):
		return http.StatusConflict, CodeRefused
	case errors.Is(err, ErrRolloutIDRequired):
		return http.StatusBadRequest, CodeRolloutIDRequired
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized, CodeUnauthorized
	case errors.Is(err, ErrCheckpointState):
		return http.StatusUnprocessableEntity, CodeCheckpointState
	case errors.Is(err, ErrInvalidRequest):
		return http.StatusUnprocessableEntity, CodeInvalidRequest
	default:
		return http.StatusInternalServerError, CodeInternal
	}
}

// Sentinel returns the refusal a code names on the wire (the inverse of
// Classify), so a client can hand on a peer's refusal as its own: nil for
// a code Gym does not define.
func Sentinel(code string) error {
	switch code {
	case CodeRefused:
		return ErrRefused
	case CodeStaleCheckpoint:
		return ErrStaleCheckpoint
	case CodeConflict:
		return ErrCheckpointConflict
	case CodeInvalidPhase:
		return ErrInvalidPhase
	case CodeDeadlineExceeded:
		return ErrDeadlineExceeded
	case CodeStaleAttempt:
		return ErrStaleAttempt
	case CodeCheckpointParked:
		return ErrCheckpointParked
	case CodeRestartInScope:
		return ErrRestartInScope
	case CodeRolloutIDRequired:
		return ErrRolloutIDRequired
	case CodeUnauthorized:
		return ErrUnauthorized
	case CodeCheckpointState:
		return ErrCheckpointState
	}
	return nil
}

// ErrorBody is the error envelope {"error": {"code", "detail"}} every
// refusal of Gym's checkpoint wire is answered with.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of the envelope: the stable code and a text
// for people.
type ErrorDetail struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// Envelope builds the status and envelope for err, its detail capped by
// CapDetail.
func Envelope(err error) (int, ErrorBody) {
	status, code := Classify(err)
	return status, ErrorBody{Error: ErrorDetail{Code: code, Detail: CapDetail(err.Error())}}
}

// MaxDetailBytes bounds the detail of every error reply (and of the log
// line that reports it), on every server of this module: an error that
// echoes its input (a 4 MiB checkpoint id, a 60 KB cookie) never comes
// back whole. docs/gym.md documents it.
const MaxDetailBytes = 4 << 10

// CapDetail is the one cap of an error reply's text: at most
// MaxDetailBytes bytes of valid UTF-8, its end replaced by a note of how
// many bytes were cut when it is longer.
func CapDetail(text string) string {
	if len(text) <= MaxDetailBytes {
		return text
	}
	note := fmt.Sprintf("... (%d bytes cut)", len(text))
	return strings.ToValidUTF8(text[:MaxDetailBytes-len(note)], "") + note
}

// StorageRefusal is the one rule for a disk that fails under checkpoint
// state, whichever participant meets it (the agent writing its records, the
// owner snapshotting a sandbox for its records, either reading them back):
// an error holding an *fs.PathError or *os.LinkError (a full or read-only
// disk, a missing folder) becomes ErrCheckpointState (422
// invalid_checkpoint_state) whose detail is what (formatted) and the error,
// which names the path. Any other error, and one that already wraps a
// refusal of the wire, is returned as it is.
func StorageRefusal(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	if _, code := Classify(err); code != CodeInternal {
		return err
	}
	var pathErr *fs.PathError
	var linkErr *os.LinkError
	if !errors.As(err, &pathErr) && !errors.As(err, &linkErr) {
		return err
	}
	return refuseCause(ErrCheckpointState, err, "%s: %v", fmt.Sprintf(format, args...), err)
}

// refusal is an error whose text is only its detail and which wraps one
// sentinel, so the wire detail carries no repeated code.
type refusal struct {
	kind   error
	cause  error
	detail string
}

func (r *refusal) Error() string { return r.detail }

func (r *refusal) Unwrap() []error {
	if r.cause == nil {
		return []error{r.kind}
	}
	return []error{r.kind, r.cause}
}

// Refuse returns an error of class kind (one of the sentinels above) whose
// text is the formatted detail. Participants use it to refuse with Gym's
// codes.
func Refuse(kind error, format string, args ...any) error {
	return &refusal{kind: kind, detail: fmt.Sprintf(format, args...)}
}

// refuseCause is Refuse that also keeps the error that caused it, for
// errors.Is and errors.As (an *os.PathError under a store error).
func refuseCause(kind, cause error, format string, args ...any) error {
	return &refusal{kind: kind, cause: cause, detail: fmt.Sprintf(format, args...)}
}
