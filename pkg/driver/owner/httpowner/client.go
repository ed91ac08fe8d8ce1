// Package httpowner is the HTTP client of a sandbox owner (a resources
// server): /seed_session, /sandbox_access, /verify and /close_session, with
// the session cookies the seed reply set and the checkpoint headers it
// carries. Transport errors are retried with backoff; an HTTP 4xx never is.
package httpowner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/gym"
)

// Headers of the checkpoint protocol on the seed reply.
const (
	HeaderRestart = "x-ng-checkpoint-restart"
	HeaderVerify  = "x-ng-checkpoint-verify"
)

// Client talks to one owner.
type Client struct {
	// BaseURL is the owner's address, e.g. http://127.0.0.1:8081.
	BaseURL string
	// HTTP is the client used (a default with timeouts when nil).
	HTTP *http.Client
	// Timeout bounds one call (Verify gets VerifyTimeout).
	Timeout, VerifyTimeout time.Duration
	// Retries is how many times a transport error is retried (3 when 0).
	Retries int
	// Backoff is the first wait between retries, doubled each time.
	Backoff time.Duration
}

// Error is a reply the owner sent with a status >= 400.
type Error struct {
	Call   string
	Status int
	Body   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("owner %s answered %d: %s", e.Call, e.Status, e.Body)
}

// ErrTransport wraps a call that did not get an answer after its retries.
var ErrTransport = errors.New("owner unreachable")

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// call posts body to path with the cookies, retrying transport errors (and
// 502/503/504, where the request never reached the owner's handler) with
// backoff. It returns the reply's status, headers and body.
//
// A call that is not idempotent (seed, verify) is retried only when the
// request cannot have reached the owner: the connection was refused, or a
// proxy answered 502/503/504. An idempotent one (sandbox_access,
// close_session) is retried after any transport error, a timeout too.
func (c *Client) call(ctx context.Context, name, path string, cookies owner.Cookies, body []byte, timeout time.Duration) (*http.Response, []byte, error) {
	idempotent := name == "sandbox_access" || name == "close_session"
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	retries := c.Retries
	if retries <= 0 {
		retries = 3
	}
	backoff := c.Backoff
	if backoff <= 0 {
		backoff = 200 * time.Millisecond
	}
	var lastErr error
	for attempt := 0; attempt <= retries; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			backoff *= 2
		}
		resp, data, err := c.once(ctx, path, cookies, body, timeout)
		if err == nil && resp.StatusCode != http.StatusBadGateway && resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusGatewayTimeout {
			return resp, data, nil
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		if err != nil {
			lastErr = err
			if !idempotent && !notSent(err) {
				break
			}
		} else {
			lastErr = &Error{Call: name, Status: resp.StatusCode, Body: snippet(data)}
		}
	}
	return nil, nil, fmt.Errorf("%w: %s %s: %v", ErrTransport, name, c.BaseURL, lastErr)
}

func (c *Client) once(ctx context.Context, path string, cookies owner.Cookies, body []byte, timeout time.Duration) (*http.Response, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range cookies {
		req.AddCookie(&http.Cookie{Name: k, Value: v})
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, nil, err
	}
	return resp, data, nil
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

func statusError(name string, resp *http.Response, data []byte) error {
	if resp.StatusCode < 400 {
		return nil
	}
	e := &Error{Call: name, Status: resp.StatusCode, Body: snippet(data)}
	if resp.StatusCode == http.StatusGone {
		return fmt.Errorf("%w: %v", owner.ErrClosed, e)
	}
	// A refusal in Gym's envelope (stale_attempt, checkpoint_parked, ...)
	// is handed on as the same refusal, so the run's caller gets Gym's code.
	// Not unauthorized: the owner refused this driver's session cookie, not
	// the run's caller (whose /run would read as a bad token); it stays an
	// owner error.
	var env gym.ErrorBody
	if resp.StatusCode < 500 && json.Unmarshal(data, &env) == nil {
		if kind := gym.Sentinel(env.Error.Code); kind != nil && kind != gym.ErrUnauthorized {
			return fmt.Errorf("%w: %w", kind, e)
		}
	}
	return e
}

// SeedSession implements owner.Owner.
func (c *Client) SeedSession(ctx context.Context, key string, body json.RawMessage) (owner.SeedReply, error) {
	resp, data, err := c.call(ctx, "seed_session", RolloutPath(key, "seed_session"), nil, body, c.Timeout)
	if err != nil {
		return owner.SeedReply{}, err
	}
	if err := statusError("seed_session", resp, data); err != nil {
		return owner.SeedReply{}, err
	}
	reply := owner.SeedReply{Cookies: owner.Cookies{}, Body: json.RawMessage(data)}
	for _, ck := range resp.Cookies() {
		reply.Cookies[ck.Name] = ck.Value
	}
	if v := strings.TrimSpace(resp.Header.Get(HeaderRestart)); v != "" && v != "0" && !strings.EqualFold(v, "false") {
		reply.Restart = true
	}
	reply.VerifyMode = strings.TrimSpace(resp.Header.Get(HeaderVerify))
	if !json.Valid(data) {
		reply.Body = nil
	}
	return reply, nil
}

// SandboxAccess implements owner.Owner; a 404 is owner.ErrNoSandbox.
func (c *Client) SandboxAccess(ctx context.Context, key string, ck owner.Cookies) (owner.Access, error) {
	var acc owner.Access
	resp, data, err := c.call(ctx, "sandbox_access", RolloutPath(key, "sandbox_access"), ck, []byte("{}"), c.Timeout)
	if err != nil {
		return acc, err
	}
	if resp.StatusCode == http.StatusNotFound {
		return acc, fmt.Errorf("%w: %s", owner.ErrNoSandbox, snippet(data))
	}
	if err := statusError("sandbox_access", resp, data); err != nil {
		return acc, err
	}
	if err := json.Unmarshal(data, &acc); err != nil {
		return acc, fmt.Errorf("owner sandbox_access: the reply %q is not an access: %w", snippet(data), err)
	}
	return acc, nil
}

// Verify implements owner.Owner.
func (c *Client) Verify(ctx context.Context, key string, ck owner.Cookies, body json.RawMessage) (owner.VerifyReply, error) {
	timeout := c.VerifyTimeout
	if timeout <= 0 {
		timeout = 30 * time.Minute
	}
	var reply owner.VerifyReply
	resp, data, err := c.call(ctx, "verify", RolloutPath(key, "verify"), ck, body, timeout)
	if err != nil {
		return reply, err
	}
	if err := statusError("verify", resp, data); err != nil {
		return reply, err
	}
	if err := json.Unmarshal(data, &reply); err != nil {
		return reply, fmt.Errorf("owner verify: the reply %q is not a verdict: %w", snippet(data), err)
	}
	reply.Body = json.RawMessage(data)
	return reply, nil
}

// CloseSession implements owner.Owner: POST /close_session {}.
func (c *Client) CloseSession(ctx context.Context, key string, ck owner.Cookies) error {
	resp, data, err := c.call(ctx, "close_session", RolloutPath(key, "close_session"), ck, []byte("{}"), c.Timeout)
	if err != nil {
		return err
	}
	return statusError("close_session", resp, data)
}

var _ owner.Owner = (*Client)(nil)

// RolloutPath is the path of a session call of the attempt key:
// /ng-rollout/<key>/<call>, the prefix Gym's resources middleware binds the
// session by (the key path-escaped). Without a key it is /<call>.
func RolloutPath(key, call string) string {
	if key == "" {
		return "/" + call
	}
	return "/ng-rollout/" + url.PathEscape(key) + "/" + call
}

// notSent reports a transport error that means the request never reached
// the owner: the connection could not be made.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
