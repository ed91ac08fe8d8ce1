package drivertest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
)

// Owner methods, as Calls name them.
const (
	CallSeed          = "seed_session"
	CallSandboxAccess = "sandbox_access"
	CallVerify        = "verify"
	CallClose         = "close_session"
)

// Call is one call the driver made on the owner.
type Call struct {
	Method  string
	Rollout string
	Err     error
}

// Owner wraps the real lending owner: it counts the driver's calls per
// rollout, remembers each rollout's cookies, and lets a test hold a seed.
type Owner struct {
	*lending.Owner

	mu      sync.Mutex
	calls   []Call
	cookies map[string][]owner.Cookies // rollout -> the cookies of each seed
	rollout map[string]string          // session id -> rollout
	// beforeSeed, when set, runs before a seed is passed on.
	beforeSeed func(ctx context.Context, rollout string) error
	// noAccess makes /sandbox_access answer 404, as an owner without it.
	noAccess bool
}

// WithoutSandboxAccess makes SandboxAccess answer owner.ErrNoSandbox from
// now on, as Gym's main-branch SWE-bench server (it has no
// /sandbox_access; its seed reply names the sandbox).
func (o *Owner) WithoutSandboxAccess() {
	o.mu.Lock()
	o.noAccess = true
	o.mu.Unlock()
}

var _ owner.Owner = (*Owner)(nil)

// NewOwner wraps o.
func NewOwner(o *lending.Owner) *Owner {
	return &Owner{Owner: o, cookies: map[string][]owner.Cookies{}, rollout: map[string]string{}}
}

// BeforeSeed installs a hook that runs before every seed (nil removes it).
func (o *Owner) BeforeSeed(h func(ctx context.Context, rollout string) error) {
	o.mu.Lock()
	o.beforeSeed = h
	o.mu.Unlock()
}

func (o *Owner) record(method string, c owner.Cookies, rollout string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if rollout == "" && c != nil {
		rollout = o.rollout[c[lending.CookieName]]
	}
	o.calls = append(o.calls, Call{Method: method, Rollout: rollout, Err: err})
}

// SeedSession implements owner.Owner.
func (o *Owner) SeedSession(ctx context.Context, key string, body json.RawMessage) (owner.SeedReply, error) {
	var b struct {
		RolloutID string `json:"rollout_id"`
	}
	_ = json.Unmarshal(body, &b)
	o.mu.Lock()
	hook := o.beforeSeed
	o.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, b.RolloutID); err != nil {
			o.record(CallSeed, nil, b.RolloutID, err)
			return owner.SeedReply{}, err
		}
	}
	reply, err := o.Owner.SeedSession(ctx, key, body)
	if err == nil {
		o.mu.Lock()
		o.cookies[b.RolloutID] = append(o.cookies[b.RolloutID], reply.Cookies)
		o.rollout[reply.Cookies[lending.CookieName]] = b.RolloutID
		o.mu.Unlock()
	}
	o.record(CallSeed, nil, b.RolloutID, err)
	return reply, err
}

// SandboxAccess implements owner.Owner.
func (o *Owner) SandboxAccess(ctx context.Context, key string, c owner.Cookies) (owner.Access, error) {
	o.mu.Lock()
	none := o.noAccess
	o.mu.Unlock()
	if none {
		err := fmt.Errorf("drivertest: %w: this owner has no /sandbox_access", owner.ErrNoSandbox)
		o.record(CallSandboxAccess, c, "", err)
		return owner.Access{}, err
	}
	a, err := o.Owner.SandboxAccess(ctx, key, c)
	o.record(CallSandboxAccess, c, "", err)
	return a, err
}

// Verify implements owner.Owner.
func (o *Owner) Verify(ctx context.Context, key string, c owner.Cookies, body json.RawMessage) (owner.VerifyReply, error) {
	r, err := o.Owner.Verify(ctx, key, c, body)
	o.record(CallVerify, c, "", err)
	return r, err
}

// CloseSession implements owner.Owner.
func (o *Owner) CloseSession(ctx context.Context, key string, c owner.Cookies) error {
	err := o.Owner.CloseSession(ctx, key, c)
	o.record(CallClose, c, "", err)
	return err
}

// Calls returns the calls made for rollout ("" for every rollout).
func (o *Owner) Calls(rollout string) []Call {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []Call
	for _, c := range o.calls {
		if rollout == "" || c.Rollout == rollout {
			out = append(out, c)
		}
	}
	return out
}

// Count counts the calls of method made for rollout.
func (o *Owner) Count(method, rollout string) int {
	n := 0
	for _, c := range o.Calls(rollout) {
		if c.Method == method {
			n++
		}
	}
	return n
}

// Cookies returns the cookies of every seed of rollout, in order.
func (o *Owner) Cookies(rollout string) []owner.Cookies {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]owner.Cookies(nil), o.cookies[rollout]...)
}

// Adopt remembers cookies of a session the test seeded itself.
func (o *Owner) Adopt(rollout string, c owner.Cookies) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cookies[rollout] = append(o.cookies[rollout], c)
	o.rollout[c[lending.CookieName]] = rollout
}
