package driver

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/gym"
)

// BookmarkVersion is the bookmark format this build writes and reads.
const BookmarkVersion = 1

// Stage names the step a bookmark continues with.
type Stage string

// The stages of a run, in order.
const (
	StageSeed    Stage = "seed"
	StageHarness Stage = "harness"
	StageVerify  Stage = "verify"
	StageReturn  Stage = "return"
)

// Bookmark is where a run continues after a park or a crash. It is recorded
// before each step; a continuation validates it first. JSON, versioned:
// {"v": 1, "next": "seed" | "harness" | "verify" | "return", ...}.
type Bookmark struct {
	// V is the format version (BookmarkVersion).
	V int `json:"v"`
	// Next is the step to run next.
	Next Stage `json:"next"`
	// Restart marks a run that nothing can save: never parked, it starts
	// over from its input after a crash.
	Restart bool `json:"restart,omitempty"`
	// Cookies are the owner session's cookies (harness, verify, return).
	Cookies owner.Cookies `json:"cookies,omitempty"`
	// VerifyMode is the owner's verify mode (x-ng-checkpoint-verify):
	// VerifyReplay, or "wait" or "" (a checkpoint waits for the verify).
	VerifyMode string `json:"verify_mode,omitempty"`
	// SeedAccess is the sandbox the seed reply named, used when the owner
	// has no /sandbox_access (it answers 404).
	SeedAccess *owner.Access `json:"seed_access,omitempty"`
	// SandboxHint is the sandbox id last used, for logs and for backends
	// that can reconnect; the owner's /sandbox_access is always asked.
	SandboxHint string `json:"sandbox_hint,omitempty"`
	// State is the adapter's state: where the harness keeps its session.
	State json.RawMessage `json:"state,omitempty"`
	// Resume says the next launch continues a saved session (subject to the
	// adapter's resume decision).
	Resume bool `json:"resume,omitempty"`
	// Paused names the launch a checkpoint paused in place, so the same
	// process continues when the checkpoint opens. After a crash it is a
	// launch that is gone: the run relaunches with Resume.
	Paused *launch.Ref `json:"paused,omitempty"`
	// Launches records every launch of the run so far.
	Launches []LaunchRecord `json:"launches,omitempty"`
	// Response is what the harness produced, for verify.
	Response json.RawMessage `json:"response,omitempty"`
	// Result is the run's result, for return.
	Result json.RawMessage `json:"result,omitempty"`
}

// VerifyReplay is the verify mode of an owner whose /verify may run again
// after a crash; any other mode makes a checkpoint wait for the verify.
const VerifyReplay = "replay"

// Marshal returns the bookmark as JSON with the version set. It fails only
// when an adapter put invalid JSON in State or Response.
func (b Bookmark) Marshal() (json.RawMessage, error) {
	b.V = BookmarkVersion
	data, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadBookmark, err)
	}
	return data, nil
}

// ParseBookmark decodes and validates a bookmark. Errors wrap
// ErrBookmarkVersion or ErrBadBookmark and say what is wrong.
func ParseBookmark(data []byte) (Bookmark, error) {
	b, err := decodeBookmark(data)
	if err != nil {
		return b, err
	}
	return b, b.Validate()
}

// decodeBookmark decodes a bookmark strictly (version first, no unknown
// field, nothing after it) without checking what its stage needs.
func decodeBookmark(data []byte) (Bookmark, error) {
	var b Bookmark
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return b, fmt.Errorf("%w: empty", ErrBadBookmark)
	}
	var head struct {
		V *json.RawMessage `json:"v"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return b, fmt.Errorf("%w: %v", ErrBadBookmark, err)
	}
	if head.V == nil {
		return b, fmt.Errorf("%w: no version field \"v\"", ErrBadBookmark)
	}
	var v int
	if err := json.Unmarshal(*head.V, &v); err != nil {
		return b, fmt.Errorf("%w: version %s is not an integer", ErrBadBookmark, *head.V)
	}
	if v != BookmarkVersion {
		return b, fmt.Errorf("%w: version %d (this build reads %d)", ErrBookmarkVersion, v, BookmarkVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return b, fmt.Errorf("%w: %v", ErrBadBookmark, err)
	}
	if dec.More() {
		return b, fmt.Errorf("%w: trailing data after the bookmark", ErrBadBookmark)
	}
	// The decoder matches names regardless of case and takes null for a
	// zero value: names spelled exactly, no null where a value belongs.
	if err := gym.CheckStrict(data, &b); err != nil {
		return b, fmt.Errorf("%w: %v", ErrBadBookmark, err)
	}
	return b, nil
}

// Validate checks the fields each stage needs.
func (b Bookmark) Validate() error {
	if b.V != BookmarkVersion {
		return fmt.Errorf("%w: version %d (this build reads %d)", ErrBookmarkVersion, b.V, BookmarkVersion)
	}
	switch b.Next {
	case StageSeed:
	case StageHarness:
		if len(b.State) == 0 || !json.Valid(b.State) {
			return fmt.Errorf("%w: a harness bookmark needs the adapter's state", ErrBadBookmark)
		}
		if b.Paused != nil && (b.Paused.ID == "" || b.Paused.Dir == "") {
			return fmt.Errorf("%w: the paused launch has no id or folder", ErrBadBookmark)
		}
	case StageVerify:
		if len(b.Response) == 0 || !json.Valid(b.Response) {
			return fmt.Errorf("%w: a verify bookmark needs the harness's response", ErrBadBookmark)
		}
	case StageReturn:
		if len(b.Result) == 0 || !json.Valid(b.Result) {
			return fmt.Errorf("%w: a return bookmark needs the result", ErrBadBookmark)
		}
	case "":
		return fmt.Errorf("%w: no \"next\" stage", ErrBadBookmark)
	default:
		return fmt.Errorf("%w: unknown stage %q (want seed, harness, verify or return)", ErrBadBookmark, b.Next)
	}
	if b.Restart && b.Next == StageHarness && b.Paused != nil {
		return fmt.Errorf("%w: a restart run is never parked, yet the bookmark holds a paused launch", ErrBadBookmark)
	}
	for i, l := range b.Launches {
		if l.ID == "" {
			return fmt.Errorf("%w: launch %d has no id", ErrBadBookmark, i)
		}
		switch l.Outcome {
		case OutcomeFinished, OutcomeInterrupted, OutcomeFailed, OutcomeRunning:
		default:
			return fmt.Errorf("%w: launch %s has an unknown outcome %q", ErrBadBookmark, l.ID, l.Outcome)
		}
	}
	return nil
}

// Clone returns a deep copy, so a recorded bookmark is never changed by the
// run that goes on.
func (b Bookmark) Clone() Bookmark {
	c := b
	c.Cookies = make(owner.Cookies, len(b.Cookies))
	for k, v := range b.Cookies {
		c.Cookies[k] = v
	}
	c.Launches = append([]LaunchRecord(nil), b.Launches...)
	if b.Paused != nil {
		p := *b.Paused
		c.Paused = &p
	}
	if b.SeedAccess != nil {
		a := *b.SeedAccess
		c.SeedAccess = &a
	}
	return c
}
