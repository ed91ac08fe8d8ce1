package opensandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// StatusError is a reply with an HTTP status the call did not expect. It
// wraps the class the status belongs to (sandbox.ErrUnauthorized for 401
// and 403, sandbox.ErrTransport for 502, 503 and 504), and for 404 the
// class the caller gives it (the sandbox gone, or a path or id not found).
type StatusError struct {
	// What names the call ("POST /command").
	What string
	// Status is the HTTP status code.
	Status int
	// Code and Message are the service's error body, when it sent one.
	Code, Message string
	class         error
}

func (e *StatusError) Error() string {
	msg := e.Message
	if e.Code != "" {
		msg = e.Code + ": " + msg
	}
	s := fmt.Sprintf("%s: HTTP %d", e.What, e.Status)
	if e.class != nil {
		s += " (" + e.class.Error() + ")"
	}
	if strings.TrimSpace(msg) != "" {
		s += ": " + strings.TrimSpace(msg)
	}
	return s
}

// Unwrap returns the error class of the status.
func (e *StatusError) Unwrap() error { return e.class }

// errorBody is the services' error envelope: {code, message}, or execd's
// token filter's {error}.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Error   string `json:"error"`
}

// statusError reads an unexpected reply into a *StatusError. notFound is
// the class of a 404 (nil: none).
func statusError(what string, resp *http.Response, notFound error) *StatusError {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &StatusError{What: what, Status: resp.StatusCode}
	var eb errorBody
	if json.Unmarshal(data, &eb) == nil && (eb.Code != "" || eb.Message != "" || eb.Error != "") {
		e.Code, e.Message = eb.Code, eb.Message
		if e.Message == "" {
			e.Message = eb.Error
		}
	} else {
		e.Message = string(bytes.TrimSpace(data))
		if len(e.Message) > 500 {
			e.Message = e.Message[:500] + "..."
		}
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		e.class = sandbox.ErrUnauthorized
	case http.StatusNotFound:
		e.class = notFound
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		// A proxy in front of the service could not reach it.
		e.class = sandbox.ErrTransport
	}
	return e
}

// TransportError is a request that failed below HTTP. Sent says whether
// any of it may have reached the service: a request that failed to dial
// was never sent, and is always safe to send again.
type TransportError struct {
	What string
	Sent bool
	Err  error
}

func (e *TransportError) Error() string {
	if !e.Sent {
		return fmt.Sprintf("%s: %v (%v; the request was not sent)", e.What, sandbox.ErrTransport, e.Err)
	}
	return fmt.Sprintf("%s: %v (%v)", e.What, sandbox.ErrTransport, e.Err)
}

// Unwrap returns sandbox.ErrTransport and the cause.
func (e *TransportError) Unwrap() []error { return []error{sandbox.ErrTransport, e.Err} }

// NotSent reports whether err is a request that never reached the
// service (its connection could not be made).
func NotSent(err error) bool {
	var te *TransportError
	return errors.As(err, &te) && !te.Sent
}

// transportError classifies err from http.Client.Do (sent: the response
// had begun, e.g. an error while reading the body). The context's own end
// is returned as it is (a deadline as sandbox.ErrTimeout).
func transportError(ctx context.Context, what string, err error, sent bool) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("%s: %w: %w", what, sandbox.ErrTimeout, cerr)
		}
		return fmt.Errorf("%s: %w", what, context.Cause(ctx))
	}
	if !sent && !dialFailed(err) {
		sent = true // unknown: it may have been written
	}
	if !sent {
		return &TransportError{What: what, Sent: false, Err: err}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s: %w: %v", what, sandbox.ErrTimeout, err)
	}
	return &TransportError{What: what, Sent: true, Err: err}
}

// dialFailed reports whether err is the failure to open a connection (the
// request was never written).
func dialFailed(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// backoff returns the pause before retry n (0-based): 100 ms doubling to
// at most 2 s.
func backoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(n, 5)
	return min(d, 2*time.Second)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// joinURL joins base and path with exactly one slash; a base without a
// scheme gets http:// (the lifecycle server's endpoints are host:port/path).
func joinURL(base, path string) string {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return strings.TrimRight(base, "/") + "/" + strings.TrimLeft(path, "/")
}
