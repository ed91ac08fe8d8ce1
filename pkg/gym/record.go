package gym

import (
	"bytes"
	"encoding/json"
)

// Record is one participant record as the store keeps it: a JSON object on
// one line, whose "episode_id" field names the attempt it belongs to (Gym's
// CheckpointRecord). What else the object holds is the participant's own
// (the agent's session, boundary and episode); the control plane only reads
// the episode id, to scope commits and restores.
type Record struct {
	// EpisodeID is the attempt the record was exported from.
	EpisodeID EpisodeID
	// JSON is the whole object, compact, with no trailing newline.
	JSON json.RawMessage
}

// NewRecord encodes v (a struct or map with an "episode_id" field) as a
// record. HTML characters are not escaped, so a state is stored as written.
// The encoder's output is already compact (it compacts what a Marshaler
// answers too), so it is not compacted again: a commit makes a record of
// every run, and each pass over the records counts at thousands of runs.
func NewRecord(v any) (Record, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return Record{}, Refuse(ErrCheckpointState, "checkpoint record is not JSON: %v", err)
	}
	return parseCompact(bytes.TrimRight(buf.Bytes(), "\n"))
}

// ParseRecord reads one stored record: a JSON object with a valid
// episode_id. The result holds a compact copy of line.
func ParseRecord(line []byte) (Record, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, line); err != nil {
		return Record{}, Refuse(ErrCheckpointState, "checkpoint record is not JSON: %v", err)
	}
	return parseCompact(buf.Bytes())
}

// parseCompact is ParseRecord of compact JSON, which it keeps.
func parseCompact(compact []byte) (Record, error) {
	if len(compact) == 0 || compact[0] != '{' {
		return Record{}, Refuse(ErrCheckpointState, "checkpoint record is not a JSON object")
	}
	var head struct {
		EpisodeID *json.RawMessage `json:"episode_id"`
	}
	if err := json.Unmarshal(compact, &head); err != nil || head.EpisodeID == nil {
		return Record{}, Refuse(ErrCheckpointState, "checkpoint record has no episode_id")
	}
	var id EpisodeID
	if err := id.UnmarshalJSON(*head.EpisodeID); err != nil {
		return Record{}, Refuse(ErrCheckpointState, "checkpoint record has no valid episode_id: %v", err)
	}
	return Record{EpisodeID: id, JSON: compact}, nil
}

// Decode unmarshals the record into v.
func (r Record) Decode(v any) error {
	if err := json.Unmarshal(r.JSON, v); err != nil {
		return Refuse(ErrCheckpointState, "checkpoint record of episode %q is invalid: %v", r.EpisodeID.CaptureKey(), err)
	}
	return nil
}
