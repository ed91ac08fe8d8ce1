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
	// SnapshotDeleting is a snapshot whose delete was asked for but not
	// done (on the Docker runtime: a fork of it still exists).
	SnapshotDeleting = "Deleting"
)

// CodeSnapshotInUse is the error code of a 409 to the delete of a
// snapshot that a sandbox made from it still uses.
const CodeSnapshotInUse = "SNAPSHOT::DELETE_CONFLICT"

// GoneState reports whether a sandbox in this state is gone for good:
// Failed (a deleted sandbox answers Failed between the kill of its
// container and its removal, 50 - 250 ms on the real server), Stopping
// or Terminated. It is the one rule, with a 404, by which every call of
// the backend decides that a sandbox is gone (sandbox.ErrGone).
func GoneState(state string) bool {
	switch state {
	case StateFailed, StateStopping, StateTerminated:
		return true
	}
	return false
}

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

// Alive describes a sandbox that is not gone: one the server does not
// know (404), or whose state is gone for good (GoneState), is
// sandbox.ErrGone naming its state.
func (l *Lifecycle) Alive(ctx context.Context, id string) (SandboxInfo, error) {
	info, err := l.Get(ctx, id)
	if err != nil {
		return info, err
	}
	if GoneState(info.Status.State) {
		return info, fmt.Errorf("opensandbox: sandbox %s is %s: %w", id, info.Status, sandbox.ErrGone)
	}
	return info, nil
}

// WaitRunning polls the sandbox until it is Running. A state that is gone
// for good (GoneState), or a 404, ends the wait with sandbox.ErrGone
// naming it.
func (l *Lifecycle) WaitRunning(ctx context.Context, id string) (SandboxInfo, error) {
	for {
		info, err := l.Alive(ctx, id)
		if err != nil {
			return info, err
		}
		if info.Status.State == StateRunning {
			return info, nil
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
// sandbox.ErrNotFound, and one a sandbox made from it still uses (409
// SNAPSHOT::DELETE_CONFLICT: it stays, Deleting, until that sandbox is
// gone and the delete is sent again) is sandbox.ErrSnapshotInUse.
func (l *Lifecycle) DeleteSnapshot(ctx context.Context, id string) error {
	err := l.call(ctx, http.MethodDelete, "/snapshots/"+esc(id), nil, nil, true, sandbox.ErrNotFound, http.StatusNoContent, http.StatusOK, http.StatusAccepted)
	var se *StatusError
	if errors.As(err, &se) && se.Status == http.StatusConflict && se.Code == CodeSnapshotInUse {
		se.class = sandbox.ErrSnapshotInUse
	}
	if err != nil {
		return fmt.Errorf("opensandbox: delete snapshot %s: %w", id, err)
	}
	return nil
}

// ListPageSize is how many items a list asks for per page (the real
// server allows up to 200).
const ListPageSize = 100

// listPage is one page of a list reply.
type listPage[T any] struct {
	Items      []T `json:"items"`
	Pagination struct {
		HasNextPage bool `json:"hasNextPage"`
	} `json:"pagination"`
}

// list reads every page of GET path?query, at most 1000 pages.
func list[T any](ctx context.Context, l *Lifecycle, path string, query url.Values) ([]T, error) {
	var out []T
	for pg := 1; pg <= 1000; pg++ {
		query.Set("page", strconv.Itoa(pg))
		query.Set("pageSize", strconv.Itoa(ListPageSize))
		var p listPage[T]
		if err := l.call(ctx, http.MethodGet, path+"?"+query.Encode(), nil, &p, true, nil, http.StatusOK); err != nil {
			return out, err
		}
		out = append(out, p.Items...)
		if !p.Pagination.HasNextPage || len(p.Items) == 0 {
			return out, nil
		}
	}
	return out, fmt.Errorf("GET %s: more than 1000 pages", path)
}

// ListSandboxes lists the sandboxes whose metadata holds every pair of
// metadata (nil: all of them).
func (l *Lifecycle) ListSandboxes(ctx context.Context, metadata map[string]string) ([]SandboxInfo, error) {
	q := url.Values{}
	if len(metadata) > 0 {
		m := url.Values{}
		for k, v := range metadata {
			m.Set(k, v)
		}
		q.Set("metadata", m.Encode())
	}
	out, err := list[SandboxInfo](ctx, l, "/sandboxes", q)
	if err != nil {
		return out, fmt.Errorf("opensandbox: list sandboxes: %w", err)
	}
	return out, nil
}

// ListSnapshots lists the snapshots taken of sandboxID (every sandbox's
// when "") named name (any name when "").
func (l *Lifecycle) ListSnapshots(ctx context.Context, sandboxID, name string) ([]SnapshotInfo, error) {
	q := url.Values{}
	if sandboxID != "" {
		q.Set("sandboxId", sandboxID)
	}
	if name != "" {
		q.Set("name", name)
	}
	out, err := list[SnapshotInfo](ctx, l, "/snapshots", q)
	if err != nil {
		return out, fmt.Errorf("opensandbox: list snapshots: %w", err)
	}
	return out, nil
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

// SweepPatience bounds how long Sweep waits for a snapshot that a sandbox
// being removed still uses.
const SweepPatience = time.Minute

// Sweep removes from the server every sandbox whose metadata holds every
// pair of metadata, and every snapshot taken of those sandboxes or of the
// sandboxes ids names (ones already removed among them), sandboxes first:
// a snapshot that a sandbox made from it still uses cannot be removed
// (sandbox.ErrSnapshotInUse), so one refused so is tried again, up to
// SweepPatience, while its forks go. It is how the project's tests leave
// nothing on a real server, their sandboxes carrying a label of their own
// (snapshots carry no metadata: they are found by the sandbox they were
// taken of). The error names what could not be removed; the rest is.
func (l *Lifecycle) Sweep(ctx context.Context, metadata map[string]string, ids []string) error {
	if len(metadata) == 0 && len(ids) == 0 {
		return errors.New("opensandbox: sweep: no label and no sandbox named: refusing to remove everything")
	}
	seen := map[string]bool{}
	var sandboxes []string
	if len(metadata) > 0 {
		labelled, err := l.ListSandboxes(ctx, metadata)
		if err != nil {
			return fmt.Errorf("opensandbox: sweep: %w", err)
		}
		for _, sb := range labelled {
			if !seen[sb.ID] {
				seen[sb.ID] = true
				sandboxes = append(sandboxes, sb.ID)
			}
		}
	}
	for _, id := range ids {
		if id != "" && !seen[id] {
			seen[id] = true
			sandboxes = append(sandboxes, id)
		}
	}
	var errs []error
	var snaps []string
	for _, id := range sandboxes {
		taken, err := l.ListSnapshots(ctx, id, "")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, sn := range taken {
			snaps = append(snaps, sn.ID)
		}
	}
	for _, id := range sandboxes {
		if err := l.Delete(ctx, id); err != nil && !errors.Is(err, sandbox.ErrGone) {
			errs = append(errs, err)
		}
	}
	deadline := time.Now().Add(SweepPatience)
	for n := 0; len(snaps) > 0; n++ {
		var inUse []string
		var last error
		for _, id := range snaps {
			err := l.DeleteSnapshot(ctx, id)
			switch {
			case errors.Is(err, sandbox.ErrSnapshotInUse):
				inUse, last = append(inUse, id), err
			case err != nil && !errors.Is(err, sandbox.ErrNotFound):
				errs = append(errs, err)
			}
		}
		snaps = inUse
		if len(snaps) == 0 {
			break
		}
		if time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("%d snapshots still in use after %s, %s among them: %w", len(snaps), SweepPatience, snaps[0], last))
			break
		}
		if err := sleep(ctx, backoff(n)); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("opensandbox: sweep: %w", err)
	}
	return nil
}
