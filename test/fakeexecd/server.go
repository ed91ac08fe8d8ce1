// Package fakeexecd is a fake OpenSandbox of the project's own: a
// lifecycle server (sandboxes from an image or a snapshot, snapshots,
// expiration, the endpoint lookup) and, per sandbox, an execd that runs
// commands for real on this machine, implementing the documented
// endpoints, the event stream and the headers that the opensandbox backend
// uses.
//
// Each sandbox is a folder (kept by a local sandbox backend under
// Options.Base) seen at one fixed path, the mount point, by every command
// run in it: each command runs in a mount namespace of its own in which
// the folder is bind-mounted there (so it needs root), so a fork of a
// snapshot has the same paths. Deleting a sandbox kills every process
// running in it, as a container's processes end with the container.
//
// By default it behaves as real execd was measured to (OpenSandbox commit
// 4db3a993, see shared/notes/sandbox-backends.md): a command's output is
// written to files that are polled every 100 ms and sent one event per
// line with its "\n" or "\r" dropped (a blank line as "\n", invalid UTF-8
// as U+FFFD); a non-zero exit is an error event with the code as evalue,
// a signal or execd's own timeout "-1" with the traceback "signal:
// killed"; a client that goes away does not end its command; the stream
// closes GracefulDelay (1 s) after the final event, with a ping every 3
// s from init on; a background command's init comes before it is
// registered (its status is 404 for a moment); an interrupt of an unknown
// or finished id is 500 "no such session" and otherwise blocks 3 s (TERM,
// then KILL); commands inherit execd's whole environment. The endpoint
// lookup answers as the server's Docker runtime (host:port/proxy/44772,
// no header) or its Kubernetes one (the header OpenSandbox-Secure-Access,
// which execd then requires; a refusal is 401 {"error": ...}).
//
// Fault modes reproduce what else a client must survive: a finished
// background command reported as running for a while (SetLateCompletion),
// command ids forgotten (ForgetCommandIDs) or execd restarting, which also
// drops its connections and refuses new ones for a while (RestartExecd),
// and the connection of a command's stream dropped mid-stream
// (DropStreams).
package fakeexecd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// Headers of the API.
const (
	APIKeyHeader = "OPEN-SANDBOX-API-KEY"
	// SecureAccessHeader is the header the Kubernetes runtime's endpoint
	// names (with the sandbox's token).
	SecureAccessHeader = "OpenSandbox-Secure-Access"
	TailCursorHeader   = "EXECD-COMMANDS-TAIL-CURSOR"
	// ExecdPort is the port the endpoint lookup answers for.
	ExecdPort = 44772
)

// Options configure a Server.
type Options struct {
	// Base is the folder holding the sandboxes and snapshots (absolute).
	Base string
	// Store, if set, keeps the sandboxes instead (Base and MountPoint are
	// then the store's): a test can look at them as local sandboxes.
	Store *local.Backend
	// MountPoint is where a sandbox's folder appears to its commands
	// (default /sandbox).
	MountPoint string
	// APIKey is required in OPEN-SANDBOX-API-KEY ("" accepts any).
	APIKey string
	// ReadyAfter is how long a new sandbox stays Pending (default 100 ms).
	ReadyAfter time.Duration
	// SnapshotAfter is how long after its copy a snapshot stays Creating
	// (default 100 ms).
	SnapshotAfter time.Duration
	// Log receives a line per request that failed (nil: discarded).
	Log *slog.Logger

	// Runtime is the shape of the endpoint lookup's answer (default
	// RuntimeDocker).
	Runtime Runtime
	// GracefulDelay is how long execd keeps a command's stream open after
	// its final event (0: 1 s, as execd's default; negative: none).
	GracefulDelay time.Duration
	// PingInterval is the interval of ping events (default 3 s).
	PingInterval time.Duration
	// PollInterval is how often a command's output files are read
	// (default 100 ms).
	PollInterval time.Duration
	// RegisterDelay is how long after its init a background command is
	// unknown to the status endpoint (0: 20 ms; negative: none).
	RegisterDelay time.Duration
	// InterruptGrace is how long an interrupt waits between SIGTERM and
	// SIGKILL, inside the request (default 3 s).
	InterruptGrace time.Duration
	// Env is execd's environment, which every command inherits (nil: this
	// process's).
	Env []string
}

// Runtime is the lifecycle server's runtime, which decides how the
// endpoint lookup says to reach execd.
type Runtime int

const (
	// RuntimeDocker answers host:port/proxy/44772 (execd's own reverse
	// proxy) and names no header; execd checks no token.
	RuntimeDocker Runtime = iota
	// RuntimeKubernetes answers host:port with the header
	// OpenSandbox-Secure-Access, which execd requires (401 without it).
	RuntimeKubernetes
)

// DropPoint says when a dropped stream is cut.
type DropPoint int

const (
	// DropAfterInit cuts the connection once the init event is sent: the
	// command goes on (execd does not end a command whose client went
	// away), its outcome unknown to the client.
	DropAfterInit DropPoint = iota
	// DropBeforeEnd lets the command finish and cuts the connection just
	// before its end is reported: it ran, and the client cannot know.
	DropBeforeEnd
)

// Server is the fake OpenSandbox. Make it with Start.
type Server struct {
	opt   Options
	store *local.Backend
	ln    net.Listener
	hs    *http.Server
	url   string

	mu        sync.Mutex
	sandboxes map[string]*fakeSandbox
	snapshots map[string]*snapshot
	late      time.Duration
	drops     []dropRule
	machine   string
	shimDir   string
	closed    bool
	quit      chan struct{} // closed by Close
	wg        sync.WaitGroup
}

type snapshot struct {
	id, sandboxID, name, state string
	created                    time.Time
}

type dropRule struct {
	match func(string) bool
	left  int
	when  DropPoint
}

type fakeSandbox struct {
	id         string
	name       string
	state      string
	reason     string
	image      string
	snapshotID string
	metadata   map[string]string
	created    time.Time
	expires    time.Time
	renewals   []time.Time
	execd      *execd
}

// Start starts the lifecycle server on 127.0.0.1 (a free port).
func Start(opt Options) (*Server, error) {
	if opt.Store != nil {
		opt.Base, opt.MountPoint = opt.Store.Base(), opt.Store.MountPoint()
		if opt.MountPoint == "" {
			return nil, errors.New("fakeexecd: the store runs without namespace isolation")
		}
	}
	if opt.Base == "" || !filepath.IsAbs(opt.Base) {
		return nil, fmt.Errorf("fakeexecd: base %q is not absolute", opt.Base)
	}
	if opt.MountPoint == "" {
		opt.MountPoint = local.DefaultMountPoint
	}
	if opt.ReadyAfter <= 0 {
		opt.ReadyAfter = 100 * time.Millisecond
	}
	if opt.SnapshotAfter <= 0 {
		opt.SnapshotAfter = 100 * time.Millisecond
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.GracefulDelay == 0 {
		opt.GracefulDelay = time.Second
	}
	if opt.PingInterval <= 0 {
		opt.PingInterval = 3 * time.Second
	}
	if opt.PollInterval <= 0 {
		opt.PollInterval = 100 * time.Millisecond
	}
	if opt.RegisterDelay == 0 {
		opt.RegisterDelay = 20 * time.Millisecond
	}
	if opt.InterruptGrace <= 0 {
		opt.InterruptGrace = 3 * time.Second
	}
	store := opt.Store
	if store == nil {
		var err error
		store, err = local.New(filepath.Join(opt.Base, "store"), local.Options{Isolation: local.IsolationNamespace, MountPoint: opt.MountPoint})
		if err != nil {
			return nil, fmt.Errorf("fakeexecd: %w", err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{opt: opt, store: store, ln: ln, url: "http://" + ln.Addr().String(),
		sandboxes: map[string]*fakeSandbox{}, snapshots: map[string]*snapshot{}, quit: make(chan struct{})}
	s.hs = &http.Server{Handler: s.lifecycleHandler(), ReadHeaderTimeout: 30 * time.Second}
	go s.hs.Serve(ln)
	return s, nil
}

// URL is the lifecycle server's URL (without /v1).
func (s *Server) URL() string { return s.url }

// MountPoint is where every sandbox's folder appears to its commands.
func (s *Server) MountPoint() string { return s.store.MountPoint() }

// HostPath is the sandbox's folder on this machine.
func (s *Server) HostPath(id string) string { return s.store.HostPath(id) }

// Close stops every server and kills every process of every sandbox.
func (s *Server) Close() {
	s.mu.Lock()
	if !s.closed {
		close(s.quit)
	}
	s.closed = true
	boxes := make([]*fakeSandbox, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		boxes = append(boxes, sb)
	}
	s.mu.Unlock()
	s.hs.Close()
	for _, sb := range boxes {
		sb.execd.shutdown()
		KillIn(s.store.HostPath(sb.id), s.store.MountPoint())
	}
	s.wg.Wait()
}

// SetLateCompletion makes a finished background command's status say it
// is running for d more (0: report it at once).
func (s *Server) SetLateCompletion(d time.Duration) {
	s.mu.Lock()
	s.late = d
	s.mu.Unlock()
}

func (s *Server) lateBy() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.late
}

// DropStreams cuts the connection of the next n foreground command streams
// whose command match accepts, at when.
func (s *Server) DropStreams(match func(command string) bool, n int, when DropPoint) {
	s.mu.Lock()
	s.drops = append(s.drops, dropRule{match: match, left: n, when: when})
	s.mu.Unlock()
}

// takeDrop reports whether the command's stream is to be dropped, and when.
func (s *Server) takeDrop(command string) (bool, DropPoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.drops {
		d := &s.drops[i]
		if d.left > 0 && d.match(command) {
			d.left--
			return true, d.when
		}
	}
	return false, 0
}

// SetMachine makes `uname -m` in every sandbox print m ("" for the truth).
func (s *Server) SetMachine(m string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.machine = m
	if m == "" {
		s.shimDir = ""
		return nil
	}
	dir := filepath.Join(s.opt.Base, ".fakeexecd-shim")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	script := "#!/bin/sh\nif [ \"$1\" = -m ]; then echo " + sandbox.Quote(m) + "; exit 0; fi\nexec /usr/bin/uname \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "uname"), []byte(script), 0o755); err != nil {
		return err
	}
	s.shimDir = dir
	return nil
}

// ForgetCommandIDs makes every execd forget every command id, as execd
// does when it restarts (the commands keep running).
func (s *Server) ForgetCommandIDs() {
	for _, sb := range s.list() {
		sb.execd.forget()
	}
}

// RestartExecd restarts the sandbox's execd: it forgets every command id,
// drops every connection and kills the foreground commands (their process
// groups; background commands, and what commands left in groups of their
// own, go on), refuses connections for down, then serves again at the same
// address (or, if that cannot be had, a new one that the endpoint lookup
// names).
// It returns once execd is back.
func (s *Server) RestartExecd(id string, down time.Duration) error {
	sb := s.get(id)
	if sb == nil {
		return fmt.Errorf("fakeexecd: no sandbox %s", id)
	}
	return sb.execd.restart(down)
}

// Commands lists the commands the sandbox's execd was asked to run, in
// order.
func (s *Server) Commands(id string) []string {
	sb := s.get(id)
	if sb == nil {
		return nil
	}
	return sb.execd.commandLog()
}

// CommandCounts counts the foreground and background commands the
// sandbox's execd was asked to run.
func (s *Server) CommandCounts(id string) (foreground, background int) {
	sb := s.get(id)
	if sb == nil {
		return 0, 0
	}
	sb.execd.mu.Lock()
	defer sb.execd.mu.Unlock()
	return sb.execd.foreground, sb.execd.background
}

// DropsPending counts the streams DropStreams asked for that were not
// dropped yet.
func (s *Server) DropsPending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, d := range s.drops {
		n += d.left
	}
	return n
}

// Uploads lists the paths uploaded to the sandbox, in order.
func (s *Server) Uploads(id string) []string {
	sb := s.get(id)
	if sb == nil {
		return nil
	}
	sb.execd.mu.Lock()
	defer sb.execd.mu.Unlock()
	return append([]string(nil), sb.execd.uploads...)
}

// Renewals lists the expirations the sandbox was renewed to.
func (s *Server) Renewals(id string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil {
		return append([]time.Time(nil), sb.renewals...)
	}
	return nil
}

// Sandboxes lists the ids of the sandboxes that exist.
func (s *Server) Sandboxes() []string {
	var out []string
	for _, sb := range s.list() {
		out = append(out, sb.id)
	}
	sort.Strings(out)
	return out
}

// Snapshots lists the ids of the snapshots that exist.
func (s *Server) Snapshots() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id := range s.snapshots {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Name is the name a sandbox was created with (its metadata "name").
func (s *Server) Name(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil {
		return sb.name
	}
	return ""
}

func (s *Server) list() []*fakeSandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*fakeSandbox, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		out = append(out, sb)
	}
	return out
}

func (s *Server) get(id string) *fakeSandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sandboxes[id]
}

// Delete deletes a sandbox as DELETE /sandboxes/{id} does: execd stops,
// every process in it is killed, its folder removed.
func (s *Server) Delete(id string) error {
	s.mu.Lock()
	sb := s.sandboxes[id]
	delete(s.sandboxes, id)
	s.mu.Unlock()
	if sb == nil {
		return fmt.Errorf("fakeexecd: no sandbox %s", id)
	}
	sb.execd.shutdown()
	KillIn(s.store.HostPath(id), s.store.MountPoint())
	return s.store.Remove(context.Background(), id)
}

func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// apiError writes the services' error envelope.
func apiError(w http.ResponseWriter, status int, code, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": code, "message": fmt.Sprintf(format, args...)})
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) lifecycleHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", s.createSandbox)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.getSandbox)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", s.createSnapshot)
	mux.HandleFunc("POST /v1/sandboxes/{id}/renew-expiration", s.renew)
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/{port}", s.endpoint)
	mux.HandleFunc("GET /v1/snapshots/{id}", s.getSnapshot)
	mux.HandleFunc("DELETE /v1/snapshots/{id}", s.deleteSnapshot)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.opt.APIKey != "" && r.Header.Get(APIKeyHeader) != s.opt.APIKey {
			apiError(w, http.StatusUnauthorized, "UNAUTHORIZED", "missing or wrong %s", APIKeyHeader)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

type sandboxJSON struct {
	ID         string            `json:"id"`
	Status     map[string]string `json:"status"`
	Image      map[string]string `json:"image,omitempty"`
	SnapshotID string            `json:"snapshotId,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Entrypoint []string          `json:"entrypoint"`
	ExpiresAt  time.Time         `json:"expiresAt"`
	CreatedAt  time.Time         `json:"createdAt"`
}

func (s *Server) describe(sb *fakeSandbox) sandboxJSON {
	out := sandboxJSON{ID: sb.id, Status: map[string]string{"state": sb.state}, SnapshotID: sb.snapshotID,
		Metadata: sb.metadata, Entrypoint: []string{"tail", "-f", "/dev/null"}, ExpiresAt: sb.expires, CreatedAt: sb.created}
	if sb.reason != "" {
		out.Status["reason"] = sb.reason
	}
	if sb.image != "" {
		out.Image = map[string]string{"uri": sb.image}
	}
	return out
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Image *struct {
			URI string `json:"uri"`
		} `json:"image"`
		SnapshotID string            `json:"snapshotId"`
		Timeout    int               `json:"timeout"`
		Metadata   map[string]string `json:"metadata"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "the body is not JSON: %v", err)
		return
	}
	if (req.Image == nil || req.Image.URI == "") == (req.SnapshotID == "") {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "give exactly one of image and snapshotId")
		return
	}
	if req.Timeout != 0 && (req.Timeout < 60 || req.Timeout > 86400) {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "timeout %d is not within 60..86400", req.Timeout)
		return
	}
	if req.Timeout == 0 {
		req.Timeout = 3600
	}
	id := newID("osb-")
	var err error
	if req.SnapshotID != "" {
		s.mu.Lock()
		snap := s.snapshots[req.SnapshotID]
		s.mu.Unlock()
		if snap == nil || snap.state != "Ready" {
			apiError(w, http.StatusNotFound, "NOT_FOUND", "no ready snapshot %s", req.SnapshotID)
			return
		}
		_, err = s.store.Fork(r.Context(), req.SnapshotID, id)
	} else {
		_, err = s.store.Create(r.Context(), id)
	}
	if err != nil {
		apiError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "make the sandbox: %v", err)
		return
	}
	now := time.Now().UTC()
	sb := &fakeSandbox{id: id, state: "Pending", snapshotID: req.SnapshotID, metadata: req.Metadata,
		created: now, expires: now.Add(time.Duration(req.Timeout) * time.Second)}
	if req.Image != nil {
		sb.image = req.Image.URI
	}
	sb.name = req.Metadata["name"]
	sb.execd = newExecd(s, id)
	if err := sb.execd.listen(""); err != nil {
		_ = s.store.Remove(context.Background(), id)
		apiError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "start execd: %v", err)
		return
	}
	s.mu.Lock()
	s.sandboxes[id] = sb
	s.mu.Unlock()
	failed := strings.HasPrefix(sb.image, "fail")
	s.after(s.opt.ReadyAfter, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if sb.state == "Pending" {
			sb.state = "Running"
			if failed {
				sb.state, sb.reason = "Failed", "image_pull_error"
			}
		}
	})
	s.mu.Lock()
	d := s.describe(sb)
	s.mu.Unlock()
	reply(w, http.StatusAccepted, d)
}

// after runs fn after d (not once the server is closed).
func (s *Server) after(d time.Duration, fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		time.Sleep(d)
		fn()
	}()
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[r.PathValue("id")]
	if sb == nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "sandbox %s not found", r.PathValue("id"))
		return
	}
	reply(w, http.StatusOK, s.describe(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.Delete(r.PathValue("id")); err != nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "sandbox %s not found", r.PathValue("id"))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ExpiresAt time.Time `json:"expiresAt"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ExpiresAt.IsZero() {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "want {\"expiresAt\": RFC 3339}")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[r.PathValue("id")]
	if sb == nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "sandbox %s not found", r.PathValue("id"))
		return
	}
	if !req.ExpiresAt.After(time.Now()) {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "expiresAt %s is not in the future", req.ExpiresAt)
		return
	}
	sb.expires = req.ExpiresAt.UTC()
	sb.renewals = append(sb.renewals, sb.expires)
	reply(w, http.StatusOK, map[string]time.Time{"expiresAt": sb.expires})
}

func (s *Server) endpoint(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	sb := s.sandboxes[r.PathValue("id")]
	s.mu.Unlock()
	if sb == nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "sandbox %s not found", r.PathValue("id"))
		return
	}
	if r.PathValue("port") != strconv.Itoa(ExecdPort) {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "nothing listens on port %s", r.PathValue("port"))
		return
	}
	// As the real server: host:port, no scheme.
	if s.opt.Runtime == RuntimeKubernetes {
		reply(w, http.StatusOK, map[string]any{
			"endpoint": sb.execd.address(),
			"headers":  map[string]string{SecureAccessHeader: sb.execd.token},
		})
		return
	}
	reply(w, http.StatusOK, map[string]any{"endpoint": sb.execd.address() + "/proxy/" + strconv.Itoa(ExecdPort)})
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	id := r.PathValue("id")
	s.mu.Lock()
	sb := s.sandboxes[id]
	if sb == nil {
		s.mu.Unlock()
		apiError(w, http.StatusNotFound, "NOT_FOUND", "sandbox %s not found", id)
		return
	}
	if sb.state != "Running" {
		s.mu.Unlock()
		apiError(w, http.StatusConflict, "CONFLICT", "sandbox %s is %s, not Running", id, sb.state)
		return
	}
	snap := &snapshot{id: newID("snap-"), sandboxID: id, name: req.Name, state: "Creating", created: time.Now().UTC()}
	s.snapshots[snap.id] = snap
	s.mu.Unlock()
	// The copy is taken now (the caller holds the sandbox still); the
	// snapshot is reported ready a little later.
	err := s.store.Snapshot(r.Context(), id, snap.id)
	s.after(s.opt.SnapshotAfter, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			snap.state = "Failed"
			return
		}
		snap.state = "Ready"
	})
	s.mu.Lock()
	out := snapJSON(snap)
	s.mu.Unlock()
	reply(w, http.StatusAccepted, out)
}

func snapJSON(sn *snapshot) map[string]any {
	return map[string]any{"id": sn.id, "sandboxId": sn.sandboxID, "name": sn.name,
		"status": map[string]string{"state": sn.state}, "createdAt": sn.created}
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn := s.snapshots[r.PathValue("id")]
	if sn == nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "snapshot %s not found", r.PathValue("id"))
		return
	}
	reply(w, http.StatusOK, snapJSON(sn))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	sn := s.snapshots[id]
	if sn != nil && sn.state == "Creating" {
		s.mu.Unlock()
		apiError(w, http.StatusConflict, "CONFLICT", "snapshot %s is still being created", id)
		return
	}
	delete(s.snapshots, id)
	s.mu.Unlock()
	if sn == nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "snapshot %s not found", id)
		return
	}
	if err := s.store.RemoveSnapshot(r.Context(), id); err != nil && !errors.Is(err, os.ErrNotExist) {
		apiError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "%v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
