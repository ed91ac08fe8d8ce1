package gyme2e

// Reply shapes, checked as Gym's coordinator reads them: every field it
// reads present with the JSON type its code expects (a missing key is a
// KeyError in Gym, a wrong type a failed comparison), nothing it forbids.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/ngharness/ngharness/internal/e2eproc"
)

// want is the JSON type a field must hold.
type want int

const (
	wString     want = iota // a string
	wNumber                 // a number
	wInt                    // an integral number
	wBool                   // true or false
	wStrings                // a list of strings (never null)
	wObject                 // an object (never null)
	wIntMap                 // an object of integers
	wNullString             // null or a string
	wNullNumber             // null or a number
)

func (w want) String() string {
	return [...]string{"a string", "a number", "an integer", "a boolean", "a list of strings", "an object",
		"an object of integers", "null or a string", "null or a number"}[w]
}

// shape lists the fields an object must have and their types.
type shape map[string]want

// anyExtra, as the extras of checkShape, lets any other field through (a
// participant's own fields beside the ones Gym reads).
const anyExtra = "*"

// checkShape reads raw as a JSON object and checks that every field of s
// is there with its type; a field not in s is refused unless extras names
// it or holds anyExtra. It returns the fields, and every problem at once.
func checkShape(what string, raw []byte, s shape, extras ...string) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &fields) != nil {
		return nil, fmt.Errorf("%s is not a JSON object: %s", what, e2eproc.Tail(string(raw), 400))
	}
	var problems []string
	names := make([]string, 0, len(s))
	for name := range s {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		v, ok := fields[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("no field %q", name))
			continue
		}
		if err := checkType(v, s[name]); err != nil {
			problems = append(problems, fmt.Sprintf("%q: %v", name, err))
		}
	}
	for name := range fields {
		if _, ok := s[name]; !ok && !slices.Contains(extras, name) && !slices.Contains(extras, anyExtra) {
			problems = append(problems, fmt.Sprintf("unexpected field %q", name))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fields, fmt.Errorf("%s: %s; got %s", what, strings.Join(problems, "; "), e2eproc.Tail(string(raw), 600))
	}
	return fields, nil
}

func checkType(raw json.RawMessage, w want) error {
	t := bytes.TrimSpace(raw)
	isNull := string(t) == "null"
	var err error
	switch w {
	case wNullString:
		if isNull {
			return nil
		}
		w = wString
	case wNullNumber:
		if isNull {
			return nil
		}
		w = wNumber
	}
	switch w {
	case wString:
		var s string
		if len(t) == 0 || t[0] != '"' {
			err = fmt.Errorf("want %s, got %s", w, t)
		} else {
			err = json.Unmarshal(t, &s)
		}
	case wNumber, wInt:
		var n json.Number
		if len(t) == 0 || !(t[0] == '-' || t[0] >= '0' && t[0] <= '9') || json.Unmarshal(t, &n) != nil {
			err = fmt.Errorf("want %s, got %s", w, t)
		} else if _, ierr := n.Int64(); w == wInt && ierr != nil {
			err = fmt.Errorf("want %s, got %s", w, t)
		}
	case wBool:
		if string(t) != "true" && string(t) != "false" {
			err = fmt.Errorf("want %s, got %s", w, t)
		}
	case wStrings:
		var l []string
		if len(t) == 0 || t[0] != '[' || json.Unmarshal(t, &l) != nil {
			err = fmt.Errorf("want %s, got %s", w, e2eproc.Tail(string(t), 200))
		}
	case wObject, wIntMap:
		var m map[string]json.RawMessage
		if len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &m) != nil {
			err = fmt.Errorf("want %s, got %s", w, e2eproc.Tail(string(t), 200))
		} else if w == wIntMap {
			for k, v := range m {
				if checkType(v, wInt) != nil {
					err = fmt.Errorf("want %s, %q is %s", w, k, v)
				}
			}
		}
	}
	return err
}

// The shapes of Gym's replies (control.py 011c338; store.py e7e449e).
var (
	reportShape = shape{"ready": wBool, "blockers": wStrings, "blocker_count": wInt, "counts": wIntMap, "restarts": wStrings}
	statusShape = shape{"kind": wString, "instance": wString, "phase": wString, "checkpoint_id": wNullString,
		"lease_expires_at": wNullNumber, "retired_rollouts": wInt, "report": wObject}
	prepareShape  = shape{"phase": wString, "report": wObject}
	commitShape   = shape{"phase": wString, "manifest": wObject, "episode_ids": wStrings}
	restoreShape  = shape{"phase": wString, "source_checkpoint_id": wString, "restored": wStrings}
	resumeShape   = shape{"phase": wString, "idempotent": wBool}
	renewShape    = shape{"lease_expires_at": wNumber}
	retireShape   = shape{"retired": wStrings}
	forgetShape   = shape{"forgotten": wStrings}
	manifestShape = shape{"schema_version": wInt, "kind": wString, "instance": wString, "checkpoint_id": wString,
		"records_file": wString, "records_sha256": wString, "record_count": wInt}
	envelopeShape = shape{"error": wObject}
	errorShape    = shape{"code": wString, "detail": wString}
)
