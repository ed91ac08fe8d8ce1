package gym

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strconv"
)

// The /run body fields that carry a rollout's identity, as Gym's
// nemo_gym/global_config.py names them. Gym's collector stamps the task and
// rollout indexes on every row it posts; a caller that numbers its
// dispatches itself sets an explicit rollout id; a re-dispatch sets the
// attempt index.
const (
	FieldRolloutID    = "_ng_rollout_id"
	FieldTaskIndex    = "_ng_task_index"
	FieldRolloutIndex = "_ng_rollout_index"
	FieldAttemptIndex = "_ng_attempt_index"
)

// RunIdentity derives the episode a Gym /run body belongs to, following
// maybe_rollout_id_from_run_body in nemo_gym/rollout_correlation.py at
// 1e1a16cb20c749985464427048185ae215a5215f (the version with the explicit
// id; the older 3309fb1 knows only the indexes). The rules, in Gym's order:
//
//   - A body that is JSON null has no identity, like Gym's None body; any
//     other non-object is refused.
//   - _ng_rollout_id, when present and not null, wins. It must be a string
//     matching NamePattern; anything else is refused, never rewritten into
//     a different key the caller could not look up.
//   - Otherwise both _ng_task_index and _ng_rollout_index must be present
//     and not null, and the rollout id is "<task>-<rollout>". With either
//     missing there is no identity.
//   - _ng_attempt_index, read only once there is an identity, is the
//     attempt (absent or null: 0). Gym appends "-a<N>" to the capture key
//     when it is above 0; here it is EpisodeID.Attempt, so CaptureKey gives
//     the same key.
//
// No identity is ErrRolloutIDRequired (400 rollout_id_required); a
// malformed value is ErrInvalidRequest, with a one-line detail naming the
// field.
//
// Where Gym's Python is laxer, this refuses instead of guessing, because
// the result must also be a valid EpisodeId (episode_types.py 05bf55a) to
// take part in a checkpoint:
//
//   - Indexes: a JSON integer >= 0 or a string (Gym formats either as is,
//     so "7" and 7 give the same key). Booleans (Gym: "True"), floats (Gym:
//     "3.0"), negative numbers (Gym: "-1-2", "3--1"), objects and arrays
//     are refused. A derived id that then fails NamePattern is refused too.
//   - Attempt: a JSON integer, an integral float (2.0, as Python's int()
//     takes it) or a string of decimal digits ("2", which Gym's test
//     coerces); booleans (Gym's int(True) is 1), non-integral floats (Gym
//     truncates 2.5 to 2), other strings (Gym raises ValueError) and
//     negative values (Gym's main silently drops the suffix; its
//     checkpoint branch's capture_key_for refuses) are refused.
//   - An explicit id ending with the reserved "-a<N>" suffix is refused, as
//     EpisodeId refuses it; Gym's maybe_rollout_id_from_run_body would take
//     it and give a capture key that reads back as another attempt.
//   - NamePattern is matched by Go's regexp, so an id with a trailing
//     newline is refused (Python's "$" lets one through).
func RunIdentity(body []byte) (EpisodeID, error) {
	body = bytes.TrimSpace(body)
	if string(body) == "null" {
		return EpisodeID{}, Refuse(ErrRolloutIDRequired, "run body carries no rollout identity (%s, or %s and %s)", FieldRolloutID, FieldTaskIndex, FieldRolloutIndex)
	}
	if err := singleValue(body); err != nil {
		return EpisodeID{}, err
	}
	if len(body) == 0 || body[0] != '{' {
		return EpisodeID{}, Refuse(ErrInvalidRequest, "run body must be a JSON object")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return EpisodeID{}, Refuse(ErrInvalidRequest, "run body is not valid JSON: %v", err)
	}
	return RunIdentityFields(fields)
}

// RunIdentityFields is RunIdentity for a body already split into its
// top-level fields (a missing field and a JSON null are the same).
func RunIdentityFields(fields map[string]json.RawMessage) (EpisodeID, error) {
	present := func(name string) (json.RawMessage, bool) {
		raw, ok := fields[name]
		if !ok || isNull(raw) {
			return nil, false
		}
		return raw, true
	}

	var id EpisodeID
	if raw, ok := present(FieldRolloutID); ok {
		if err := decodeString(raw, FieldRolloutID, &id.RolloutID); err != nil {
			return EpisodeID{}, Refuse(ErrInvalidRequest, "%s must be a string of letters, digits, dots, dashes or underscores starting with a letter or digit; got %s", FieldRolloutID, echo(string(bytes.TrimSpace(raw))))
		}
		if !NamePattern.MatchString(id.RolloutID) {
			return EpisodeID{}, Refuse(ErrInvalidRequest, "%s must be a string of letters, digits, dots, dashes or underscores starting with a letter or digit; got %q", FieldRolloutID, echo(id.RolloutID))
		}
	} else {
		taskRaw, hasTask := present(FieldTaskIndex)
		rolloutRaw, hasRollout := present(FieldRolloutIndex)
		if !hasTask || !hasRollout {
			return EpisodeID{}, Refuse(ErrRolloutIDRequired, "run body carries no rollout identity (%s, or %s and %s)", FieldRolloutID, FieldTaskIndex, FieldRolloutIndex)
		}
		task, err := indexText(taskRaw, FieldTaskIndex)
		if err != nil {
			return EpisodeID{}, err
		}
		rollout, err := indexText(rolloutRaw, FieldRolloutIndex)
		if err != nil {
			return EpisodeID{}, err
		}
		id.RolloutID = task + "-" + rollout
		if !NamePattern.MatchString(id.RolloutID) {
			return EpisodeID{}, Refuse(ErrInvalidRequest, "rollout id %q derived from %s and %s must be letters, digits, dots, dashes or underscores starting with a letter or digit", echo(id.RolloutID), FieldTaskIndex, FieldRolloutIndex)
		}
	}

	if raw, ok := present(FieldAttemptIndex); ok {
		n, err := attemptIndex(raw)
		if err != nil {
			return EpisodeID{}, err
		}
		id.Attempt = n
	}
	if err := id.Validate(); err != nil {
		return EpisodeID{}, Refuse(ErrInvalidRequest, "run identity: %v", err)
	}
	return id, nil
}

// jsonInteger is a JSON number written without fraction or exponent.
var jsonInteger = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// decimalDigits is the attempt index as a string: digits only.
var decimalDigits = regexp.MustCompile(`^[0-9]+$`)

// indexText is a task or rollout index as it goes into the derived id: a
// non-negative JSON integer in decimal, or a string as is.
func indexText(raw json.RawMessage, field string) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := decodeString(raw, field, &s); err != nil {
			return "", err
		}
		return s, nil
	}
	text := string(raw)
	if !jsonInteger.MatchString(text) {
		return "", Refuse(ErrInvalidRequest, "%s must be a non-negative integer or a string, got %s", field, echo(text))
	}
	if text[0] == '-' {
		return "", Refuse(ErrInvalidRequest, "%s must be >= 0, got %s", field, echo(text))
	}
	return text, nil
}

// attemptIndex reads _ng_attempt_index as Python's int() would take it,
// minus the cases listed on RunIdentity.
func attemptIndex(raw json.RawMessage) (int, error) {
	raw = bytes.TrimSpace(raw)
	field := FieldAttemptIndex
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := decodeString(raw, field, &s); err != nil {
			return 0, err
		}
		if !decimalDigits.MatchString(s) {
			return 0, Refuse(ErrInvalidRequest, "%s must be a non-negative integer, got %q", field, echo(s))
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return 0, Refuse(ErrInvalidRequest, "%s %q is out of range", field, echo(s))
		}
		return n, nil
	}
	if len(raw) == 0 || !(raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')) {
		return 0, Refuse(ErrInvalidRequest, "%s must be a non-negative integer, got %s", field, echo(string(raw)))
	}
	n, err := decodeInt(raw, field)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, Refuse(ErrInvalidRequest, "%s must be >= 0, got %s", field, echo(string(raw)))
	}
	return n, nil
}
