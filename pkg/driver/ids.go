package driver

import (
	"fmt"
	"regexp"

	"github.com/ngharness/ngharness/pkg/gym"
)

// MaxRolloutIDLen bounds a rollout id.
const MaxRolloutIDLen = 128

// rolloutIDRule is the alphabet of rollout ids, as the rollout framework
// bounds its own.
var rolloutIDRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidateRolloutID checks a rollout id: 1 to MaxRolloutIDLen characters
// matching ^[A-Za-z0-9][A-Za-z0-9._-]*$, not ending in "-a<N>" (Gym's
// EpisodeId reserves that ending for attempt keys, so a resources server
// would refuse the session). The error wraps ErrBadRequest, names the
// rule, and shows at most a short prefix of the id.
func ValidateRolloutID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: no rollout id", ErrBadRequest)
	}
	if len(id) > MaxRolloutIDLen || !rolloutIDRule.MatchString(id) {
		return fmt.Errorf("%w: rollout id %s: want 1 to %d characters matching %s", ErrBadRequest, Clip(id, 40), MaxRolloutIDLen, rolloutIDRule)
	}
	if err := (gym.EpisodeID{RolloutID: id}).Validate(); err != nil {
		return fmt.Errorf("%w: rollout id %s: %v", ErrBadRequest, Clip(id, 40), err)
	}
	return nil
}

// Clip quotes s for a message or a log line, cut to at most n bytes with
// its full length said, so an input of any size is never echoed whole.
func Clip(s string, n int) string {
	if len(s) <= n {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:n], len(s))
}
