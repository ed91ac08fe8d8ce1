package opensandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// APIKeyHeader carries the lifecycle server's API key.
const APIKeyHeader = "OPEN-SANDBOX-API-KEY"

// ExecdPort is the port execd listens on inside every sandbox.
const ExecdPort = 44772

// Sandbox states the lifecycle server reports.
const (
	StatePending    = "Pending"
	StateRunning    = "Running"
	StateFailed     = "Failed"
	StateStopping   = "Stopping"
	StateTerminated = "Terminated"
)

// Snapshot states.
const (
	SnapshotCreating = "Creating"
	SnapshotReady    = "Ready"
	SnapshotFailed   = "Failed"
)

// Lifecycle is a client of the OpenSandbox lifecycle server (default port
// 8080): sandboxes from an image or a snapshot, snapshots, expiration, and
// the endpoint lookup that says how to reach a sandbox's execd. Every call
// sends the API key in OPEN-SANDBOX-API-KEY. Reads and deletes are retried
// on transport errors; a create or a snapshot is retried only when it was
// never sent.
type Lifecycle struct {
	// URL is the server, e.g. http://opensandbox:8080; "/v1" is added
	// unless the URL already ends with it.
	URL string
	// APIKey is sent in OPEN-SANDBOX-API-KEY ("" sends none).
	APIKey string
	// HTTP is the client (nil: one with no overall timeout; every call is
	// bounded by its context and CallTimeout).
	HTTP *http.Client
	// Poll is the interval of the polls that wait for a state (default
	// 500 ms).
	Poll time.Duration
	// CallTimeout bounds one request (default 60 s).
	CallTimeout time.Duration
	// Attempts is how many times a request that may be repeated is sent
	// (default 4).
	Attempts int
}

// Status is a sandbox's or snapshot's state with its reason.
type Status struct {
	State            string     `json:"state"`
	Reason           string     `json:"reason,omitempty"`
	Message          string     `json:"message,omitempty"`
	LastTransitionAt *time.Time `json:"lastTransitionAt,omitempty"`
}

func (s Status) String() string {
	out := s.State
	if s.Reason != "" {
		out += " (" + s.Reason + ")"
	}
	if s.Message != "" {
		out += ": " + s.Message
	}
	return out
}

// ImageSpec is a container image.
type ImageSpec struct {
	URI  string     `json:"uri"`
	Auth *ImageAuth `json:"auth,omitempty"`
}

// ImageAuth are registry credentials.
type ImageAuth struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// CreateRequest is the body of POST /sandboxes: exactly one of Image and
// SnapshotID.
type CreateRequest struct {
	Image          *ImageSpec        `json:"image,omitempty"`
	SnapshotID     string            `json:"snapshotId,omitempty"`
	Timeout        int               `json:"timeout,omitempty"` // seconds
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Entrypoint     []string          `json:"entrypoint,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Extensions     map[string]string `json:"extensions,omitempty"`
}

// SandboxInfo is a sandbox as the server describes it.
type SandboxInfo struct {
	ID         string            `json:"id"`
	Status     Status            `json:"status"`
	Image      *ImageSpec        `json:"image,omitempty"`
	SnapshotID string            `json:"snapshotId,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	ExpiresAt  *time.Time        `json:"expiresAt,omitempty"`
	CreatedAt  time.Time         `json:"createdAt"`
}

// SnapshotInfo is a snapshot as the server describes it.
type SnapshotInfo struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandboxId"`
	Name      string    `json:"name,omitempty"`
	Status    Status    `json:"status"`
	CreatedAt time.Time `json:"createdAt"`
}

// Endpoint is how to reach a port of a sandbox: its URL (possibly without
// a scheme: http is meant) and the headers every request must carry.
type Endpoint struct {
	URL     string            `json:"endpoint"`
	Headers map[string]string `json:"headers,omitempty"`
}

func (l *Lifecycle) client() *http.Client {
	if l.HTTP != nil {
		return l.HTTP
	}
	return http.DefaultClient
}

func (l *Lifecycle) base() string {
	u := strings.TrimRight(l.URL, "/")
	if !strings.HasSuffix(u, "/v1") {
		u += "/v1"
	}
	return u
}

func (l *Lifecycle) poll() time.Duration {
	if l.Poll > 0 {
		return l.Poll
	}
	return 500 * time.Millisecond
}

// call sends one request and decodes a reply with one of the ok statuses
// into out. repeatable: the request may be sent again after any transport
// error (not only one that was never sent). notFound is the class of a
// 404.
func (l *Lifecycle) call(ctx context.Context, method, path string, body, out any, repeatable bool, notFound error, ok ...int) error {
	what := method + " " + path
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	attempts := l.Attempts
	if attempts <= 0 {
		attempts = 4
	}
	callTimeout := l.CallTimeout
	if callTimeout <= 0 {
		callTimeout = 60 * time.Second
	}
	var last error
	for n := 0; n < attempts; n++ {
		if n > 0 {
			if err := sleep(ctx, backoff(n)); err != nil {
				return fmt.Errorf("%w (after %v)", err, last)
			}
		}
		last = l.once(ctx, callTimeout, what, method, path, data, out, notFound, ok)
		if last == nil {
			return nil
		}
		if ctx.Err() != nil || !errors.Is(last, sandbox.ErrTransport) || !(repeatable || NotSent(last)) {
			return last
		}
	}
	return last
}

func (l *Lifecycle) once(ctx context.Context, timeout time.Duration, what, method, path string, data []byte, out any, notFound error, ok []int) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if data != nil {
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(cctx, method, l.base()+path, rd)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if data != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if l.APIKey != "" {
		req.Header.Set(APIKeyHeader, l.APIKey)
	}
	resp, err := l.client().Do(req)
	if err != nil {
		return transportError(cctx, what, err, false)
	}
	defer resp.Body.Close()
	good := false
	for _, c := range ok {
		good = good || resp.StatusCode == c
	}
	if !good {
		return statusError(what, resp, notFound)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return transportError(cctx, what, err, true)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s: the reply is not the JSON expected: %v (%.200q)", what, err, raw)
	}
	return nil
}

func esc(s string) string { return url.PathEscape(s) }

// Create asks for a sandbox (from req.Image or req.SnapshotID) and returns
// the server's first answer (usually Pending). A request that reached the
// server is never sent twice.
func (l *Lifecycle) Create(ctx context.Context, req CreateRequest) (SandboxInfo, error) {
	if (req.Image == nil) == (req.SnapshotID == "") {
		return SandboxInfo{}, errors.New("opensandbox: create a sandbox from exactly one of an image and a snapshot")
	}
	var info SandboxInfo
	if err := l.call(ctx, http.MethodPost, "/sandboxes", req, &info, false, nil, http.StatusAccepted, http.StatusOK, http.StatusCreated); err != nil {
		return SandboxInfo{}, fmt.Errorf("opensandbox: create a sandbox: %w", err)
	}
	if info.ID == "" {
		return SandboxInfo{}, errors.New("opensandbox: create a sandbox: the reply names no sandbox id")
	}
	return info, nil
}

// Get describes a sandbox; one the server does not know is sandbox.ErrGone.
func (l *Lifecycle) Get(ctx context.Context, id string) (SandboxInfo, error) {
	var info SandboxInfo
	if err := l.call(ctx, http.MethodGet, "/sandboxes/"+esc(id), nil, &info, true, sandbox.ErrGone, http.StatusOK); err != nil {
		return SandboxInfo{}, fmt.Errorf("opensandbox: sandbox %s: %w", id, err)
	}
	return info, nil
}

// WaitRunning polls the sandbox until it is Running. Failed, Stopping or
// Terminated (or gone) ends the wait with an error naming the state.
func (l *Lifecycle) WaitRunning(ctx context.Context, id string) (SandboxInfo, error) {
	for {
		info, err := l.Get(ctx, id)
		if err != nil {
			return info, err
		}
		switch info.Status.State {
		case StateRunning:
			return info, nil
		case StateFailed, StateStopping, StateTerminated:
			return info, fmt.Errorf("opensandbox: sandbox %s is %s: %w", id, info.Status, sandbox.ErrGone)
		}
		if err := sleep(ctx, l.poll()); err != nil {
			return info, fmt.Errorf("opensandbox: wait for sandbox %s to run (last %s): %w", id, info.Status, err)
		}
	}
}

// Delete deletes a sandbox. One the server does not know is
// sandbox.ErrGone.
func (l *Lifecycle) Delete(ctx context.Context, id string) error {
	if err := l.call(ctx, http.MethodDelete, "/sandboxes/"+esc(id), nil, nil, true, sandbox.ErrGone, http.StatusNoContent, http.StatusOK, http.StatusAccepted); err != nil {
		return fmt.Errorf("opensandbox: delete sandbox %s: %w", id, err)
	}
	return nil
}

// CreateSnapshot asks for a snapshot of the sandbox (its files only) and
// returns the server's first answer (usually Creating).
func (l *Lifecycle) CreateSnapshot(ctx context.Context, sandboxID, name string) (SnapshotInfo, error) {
	body := map[string]string{}
	if name != "" {
		body["name"] = name
	}
	var info SnapshotInfo
	if err := l.call(ctx, http.MethodPost, "/sandboxes/"+esc(sandboxID)+"/snapshots", body, &info, false, sandbox.ErrGone, http.StatusAccepted, http.StatusOK, http.StatusCreated); err != nil {
		return SnapshotInfo{}, fmt.Errorf("opensandbox: snapshot sandbox %s: %w", sandboxID, err)
	}
	if info.ID == "" {
		return SnapshotInfo{}, fmt.Errorf("opensandbox: snapshot sandbox %s: the reply names no snapshot id", sandboxID)
	}
	return info, nil
}

// GetSnapshot describes a snapshot; one the server does not know is
// sandbox.ErrNotFound.
func (l *Lifecycle) GetSnapshot(ctx context.Context, id string) (SnapshotInfo, error) {
	var info SnapshotInfo
	if err := l.call(ctx, http.MethodGet, "/snapshots/"+esc(id), nil, &info, true, sandbox.ErrNotFound, http.StatusOK); err != nil {
		return SnapshotInfo{}, fmt.Errorf("opensandbox: snapshot %s: %w", id, err)
	}
	return info, nil
}

// WaitSnapshot polls the snapshot until it is Ready; Failed ends the wait
// with an error naming its reason.
func (l *Lifecycle) WaitSnapshot(ctx context.Context, id string) (SnapshotInfo, error) {
	for {
		info, err := l.GetSnapshot(ctx, id)
		if err != nil {
			return info, err
		}
		switch info.Status.State {
		case SnapshotReady:
			return info, nil
		case SnapshotFailed:
			return info, fmt.Errorf("opensandbox: snapshot %s of sandbox %s failed: %s", id, info.SandboxID, info.Status)
		}
		if err := sleep(ctx, l.poll()); err != nil {
			return info, fmt.Errorf("opensandbox: wait for snapshot %s (last %s): %w", id, info.Status, err)
		}
	}
}

// DeleteSnapshot deletes a snapshot; one the server does not know is
// sandbox.ErrNotFound.
func (l *Lifecycle) DeleteSnapshot(ctx context.Context, id string) error {
	if err := l.call(ctx, http.MethodDelete, "/snapshots/"+esc(id), nil, nil, true, sandbox.ErrNotFound, http.StatusNoContent, http.StatusOK, http.StatusAccepted); err != nil {
		return fmt.Errorf("opensandbox: delete snapshot %s: %w", id, err)
	}
	return nil
}

// Renew moves the sandbox's expiration to at and returns the expiration
// the server set.
func (l *Lifecycle) Renew(ctx context.Context, id string, at time.Time) (time.Time, error) {
	var out struct {
		ExpiresAt time.Time `json:"expiresAt"`
	}
	body := map[string]string{"expiresAt": at.UTC().Format(time.RFC3339)}
	if err := l.call(ctx, http.MethodPost, "/sandboxes/"+esc(id)+"/renew-expiration", body, &out, true, sandbox.ErrGone, http.StatusOK); err != nil {
		return time.Time{}, fmt.Errorf("opensandbox: renew the expiration of sandbox %s: %w", id, err)
	}
	return out.ExpiresAt, nil
}

// Endpoint looks up how to reach port of the sandbox (execd: ExecdPort).
// A sandbox the server does not know is sandbox.ErrGone.
func (l *Lifecycle) Endpoint(ctx context.Context, id string, port int, useServerProxy bool) (Endpoint, error) {
	path := "/sandboxes/" + esc(id) + "/endpoints/" + strconv.Itoa(port)
	if useServerProxy {
		path += "?use_server_proxy=true"
	}
	var ep Endpoint
	if err := l.call(ctx, http.MethodGet, path, nil, &ep, true, sandbox.ErrGone, http.StatusOK); err != nil {
		return Endpoint{}, fmt.Errorf("opensandbox: the endpoint of sandbox %s: %w", id, err)
	}
	if ep.URL == "" {
		return Endpoint{}, fmt.Errorf("opensandbox: the endpoint of sandbox %s: the reply names no URL", id)
	}
	return ep, nil
}
