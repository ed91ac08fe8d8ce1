package lending

import (
	"context"
	"fmt"

	"github.com/ngharness/ngharness/pkg/gym"
)

// The data-plane calls, for admission.
const (
	callSeed   = "seed_session"
	callAccess = "sandbox_access"
	callVerify = "verify"
	callClose  = "close_session"
)

// admission is one data-plane call asking to be let in.
type admission struct {
	call string
	// id is the attempt the call belongs to (the key it names, else the
	// session's binding); bound says whether there is one.
	id    gym.EpisodeID
	bound bool
	// s is the session the call acts on (nil for a seed).
	s *session
}

// attemptOf parses a call's capture key; "" names no attempt.
func attemptOf(key string) (gym.EpisodeID, bool, error) {
	if key == "" {
		return gym.EpisodeID{}, false, nil
	}
	id, err := gym.ParseCaptureKey(key)
	if err != nil {
		return gym.EpisodeID{}, false, fmt.Errorf("owner: %w", err)
	}
	return id, true, nil
}

// admit lets a call in as Gym's resources middleware does, and returns
// the function that ends it. A call of a retired attempt (or on a session
// a retire took) is refused with gym.ErrStaleAttempt, except a close,
// which is how state is freed. While a checkpoint has admission closed a
// call waits for it to reopen, unless the checkpoint does not wait for it:
// a verify of a session whose verify replays, and every call but the seed
// on a session the checkpoint cannot capture (it keeps running through
// the checkpoint). A call that waits is not in flight, so it never holds
// up a prepare; one that is let in counts as in flight until it ends, and
// its attempt's count is what a retire waits for. If ctx ends while the
// call waits it is refused with gym.ErrCheckpointParked.
func (o *Owner) admit(ctx context.Context, a admission) (func(), error) {
	waits, counted := true, true
	if a.s != nil && a.call != callSeed {
		if !a.s.capturable() || (a.call == callVerify && a.s.body.VerifyMode == "replay") {
			waits, counted = false, false
		}
	}
	for {
		o.mu.Lock()
		if a.call != callClose {
			if a.s != nil && o.staleLocked(a.s) {
				o.mu.Unlock()
				return nil, gym.Refuse(gym.ErrStaleAttempt, "resources session %s belongs to a retired attempt", a.s.id)
			}
			if a.bound && o.control != nil {
				// Checked under mu: a retire marks first and then reads the
				// counts under mu, so this call is refused or waited for.
				if err := o.control.CheckAttempt(a.id); err != nil {
					o.mu.Unlock()
					return nil, err
				}
			}
		}
		if waits && !o.accepting {
			opened := o.opened
			o.mu.Unlock()
			select {
			case <-opened:
				continue
			case <-ctx.Done():
				return nil, gym.Refuse(gym.ErrCheckpointParked, "resources admission is closed for checkpoint %s: %v", o.checkpointID, ctx.Err())
			}
		}
		if counted {
			o.inflight++
		}
		if a.bound {
			o.requests[a.id]++
		}
		if a.s != nil {
			a.s.restored = false // claimed: a commit that leaves it out no longer deletes it
		}
		o.mu.Unlock()
		break
	}
	return func() {
		o.mu.Lock()
		if counted {
			o.inflight--
		}
		if a.bound {
			if o.requests[a.id]--; o.requests[a.id] <= 0 {
				delete(o.requests, a.id)
			}
		}
		close(o.changed)
		o.changed = make(chan struct{})
		o.mu.Unlock()
		o.notify()
	}, nil
}

// notify tells the attached control plane that readiness may have changed.
func (o *Owner) notify() {
	o.mu.Lock()
	c := o.control
	o.mu.Unlock()
	if c != nil {
		c.Notify()
	}
}

// Attach implements owner.CheckpointOwner: the control plane's retire marks
// refuse retired attempts on the data plane, and it is told when readiness
// may have changed.
func (o *Owner) Attach(c *gym.Control) {
	o.mu.Lock()
	o.control = c
	o.mu.Unlock()
}

// CloseAdmission implements gym.Participant: session calls that arrive
// from now on wait for OpenAdmission, as on Gym's resources servers, except
// those the checkpoint does not wait for: a verify whose session replays
// it, and every call but the seed on a session the checkpoint cannot
// capture (it keeps running through the checkpoint). Calls in flight go
// on, and a prepare waits for them. A waiting call whose context ends is
// refused with gym.ErrCheckpointParked.
func (o *Owner) CloseAdmission(ctx context.Context, req gym.Request) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.checkpointID = req.CheckpointID
	if o.accepting {
		o.accepting = false
		o.opened = make(chan struct{})
	}
	return nil
}

// OpenAdmission implements gym.Participant: the sessions whose verify
// replayed during the checkpoint end now, and the waiting calls go on.
func (o *Owner) OpenAdmission(ctx context.Context) error {
	o.mu.Lock()
	ending := o.ending
	o.ending = nil
	if !o.accepting {
		o.accepting = true
		close(o.opened)
	}
	o.mu.Unlock()
	for _, s := range ending {
		s.mu.Lock()
		if !s.closed && !s.parked {
			o.endVerified(ctx, s)
		}
		s.mu.Unlock()
	}
	return nil
}

// endAtReopen keeps a session open when its verify replays and ran while
// a checkpoint has admission closed (it was let in without waiting): the
// run's boundary is before that verify, so the checkpoint exports the
// session and a restore replays the verify on it. It ends when admission
// reopens. Reports whether it was kept (s.mu held).
func (o *Owner) endAtReopen(s *session) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.accepting || s.body.VerifyMode != "replay" {
		return false
	}
	o.ending = append(o.ending, s)
	return true
}

// usable refuses a call on a session whose seed failed or whose sandbox a
// commit with stop removed (s.mu held).
func (s *session) usable() error {
	if s.failed {
		return fmt.Errorf("owner: %w: the seed of session %s failed", ErrUnknownSession, s.id)
	}
	if s.parked {
		return gym.Refuse(gym.ErrCheckpointParked, "resources session %s was parked by a commit with stop; restore the checkpoint to continue it", s.id)
	}
	return nil
}

// staleLocked reports whether calls on s are refused as stale: a retire
// took it and the controller has not forgotten its rollout (o.mu held).
// Once forgotten, a freed session answers as a closed one.
func (o *Owner) staleLocked(s *session) bool {
	return s.retired && (o.control == nil || o.control.CheckAttempt(s.episode) != nil)
}
