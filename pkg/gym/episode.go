package gym

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"unicode/utf8"
)

// NamePattern is the one identifier rule of Gym's wire: rollout ids,
// checkpoint ids, participant kinds and instances. Such a name survives a
// URL path round trip and never starts with a dot, because stores also use
// it as a file name.
var NamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// attemptSuffix is the reserved ending "-a<N>" (N >= 1, no leading zero)
// that a capture key adds for attempts after the first. A rollout id may not
// end with it, so CaptureKey is one-to-one and ParseCaptureKey its inverse.
var attemptSuffix = regexp.MustCompile(`-a([1-9][0-9]*)$`)

// EpisodeID is Gym's EpisodeId: one physical attempt of a logical rollout.
// Attempts count from 0. On the wire it is the object
// {"rollout_id": ..., "attempt": ...}; attempt may be left out (0) and any
// other field is refused, as Gym's model (extra="forbid") does.
type EpisodeID struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
}

// Validate checks the rules Gym's model enforces: a rollout id that is
// non-empty, matches NamePattern and does not end with the reserved
// attempt suffix, and an attempt >= 0. Gym sets no length limit on a
// rollout id, so neither does this.
func (e EpisodeID) Validate() error {
	if e.RolloutID == "" {
		return Refuse(ErrInvalidRequest, "rollout_id must not be empty")
	}
	if !NamePattern.MatchString(e.RolloutID) {
		return Refuse(ErrInvalidRequest, "rollout_id %q must be letters, digits, dots, dashes or underscores starting with a letter or digit", echo(e.RolloutID))
	}
	if attemptSuffix.MatchString(e.RolloutID) {
		return Refuse(ErrInvalidRequest, "rollout_id %q must not end with the reserved attempt suffix '-a<N>'", echo(e.RolloutID))
	}
	if e.Attempt < 0 {
		return Refuse(ErrInvalidRequest, "attempt %d of rollout %q must be >= 0", e.Attempt, echo(e.RolloutID))
	}
	return nil
}

// CaptureKey is the attempt-qualified key Gym uses in /ng-rollout/<key>/
// paths and in every reply list: the rollout id for attempt 0, and
// "<rollout id>-a<N>" for attempt N after it.
func (e EpisodeID) CaptureKey() string {
	if e.Attempt == 0 {
		return e.RolloutID
	}
	return e.RolloutID + "-a" + strconv.Itoa(e.Attempt)
}

// Next is the attempt that continues this one after a restore.
func (e EpisodeID) Next() EpisodeID {
	return EpisodeID{RolloutID: e.RolloutID, Attempt: e.Attempt + 1}
}

// String is the capture key, for messages.
func (e EpisodeID) String() string { return e.CaptureKey() }

// ParseCaptureKey inverts CaptureKey. A key that does not end with the
// attempt suffix is attempt 0 of itself; either way the result is
// validated, so "-a2" (empty rollout id) and "r-a1-a2" (a rollout id that
// ends with the suffix) are refused.
func ParseCaptureKey(key string) (EpisodeID, error) {
	id := EpisodeID{RolloutID: key}
	if m := attemptSuffix.FindStringSubmatchIndex(key); m != nil {
		n, err := strconv.Atoi(key[m[2]:m[3]])
		if err != nil {
			return EpisodeID{}, Refuse(ErrInvalidRequest, "capture key %q: attempt out of range", echo(key))
		}
		id = EpisodeID{RolloutID: key[:m[0]], Attempt: n}
	}
	if err := id.Validate(); err != nil {
		return EpisodeID{}, Refuse(ErrInvalidRequest, "capture key %q: %v", echo(key), err)
	}
	return id, nil
}

// UnmarshalJSON reads the wire object strictly: field names exactly as Gym
// spells them (Go's decoder would also take "Rollout_ID"), no other field,
// a string rollout id, an integer attempt (an integral float such as 2.0 is
// taken, as pydantic takes it), then Validate.
func (e *EpisodeID) UnmarshalJSON(data []byte) error {
	fields, err := strictObject(data, "episode id", "rollout_id", "attempt")
	if err != nil {
		return err
	}
	raw, ok := fields["rollout_id"]
	if !ok {
		return Refuse(ErrInvalidRequest, "episode id: rollout_id is required")
	}
	var id EpisodeID
	if err := decodeString(raw, "rollout_id", &id.RolloutID); err != nil {
		return err
	}
	if raw, ok := fields["attempt"]; ok {
		if id.Attempt, err = decodeInt(raw, "attempt"); err != nil {
			return err
		}
	}
	if err := id.Validate(); err != nil {
		return err
	}
	*e = id
	return nil
}

// strictObject splits a JSON object into its fields, refusing anything
// but an object and any field not in allowed (matched exactly).
func strictObject(data []byte, what string, allowed ...string) (map[string]json.RawMessage, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return nil, Refuse(ErrInvalidRequest, "%s must be a JSON object", what)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, Refuse(ErrInvalidRequest, "%s is not valid JSON: %v", what, err)
	}
	for name := range fields {
		known := false
		for _, a := range allowed {
			if name == a {
				known = true
				break
			}
		}
		if !known {
			return nil, Refuse(ErrInvalidRequest, "%s: unknown field %q", what, echo(name))
		}
	}
	return fields, nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func decodeString(raw json.RawMessage, field string, out *string) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return Refuse(ErrInvalidRequest, "%s must be a string", field)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return Refuse(ErrInvalidRequest, "%s: %v", field, err)
	}
	return nil
}

func decodeInt(raw json.RawMessage, field string) (int, error) {
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil || isNull(raw) {
		return 0, Refuse(ErrInvalidRequest, "%s must be an integer", field)
	}
	if i, err := strconv.Atoi(n.String()); err == nil {
		return i, nil
	}
	f, err := n.Float64()
	if err != nil || f != float64(int(f)) {
		return 0, Refuse(ErrInvalidRequest, "%s must be an integer, got %s", field, n)
	}
	return int(f), nil
}

func decodeFloat(raw json.RawMessage, field string) (float64, error) {
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil || isNull(raw) {
		return 0, Refuse(ErrInvalidRequest, "%s must be a number", field)
	}
	f, err := n.Float64()
	if err != nil {
		return 0, Refuse(ErrInvalidRequest, "%s must be a finite number, got %s", field, n)
	}
	return f, nil
}

func decodeBool(raw json.RawMessage, field string, out *bool) error {
	switch string(bytes.TrimSpace(raw)) {
	case "true":
		*out = true
	case "false":
		*out = false
	default:
		return Refuse(ErrInvalidRequest, "%s must be true or false", field)
	}
	return nil
}

// maxEcho bounds how much of a caller's value an error repeats: enough to
// recognise it, never a whole 4 KB id in a reply or a log line.
const maxEcho = 64

// echo is s as an error repeats it: whole if short, else its first maxEcho
// bytes (whole characters) and how long it was.
func echo(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	cut := maxEcho
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:cut], len(s))
}
