// Package execd is a fake OpenSandbox of the project's own: a
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
// 4db3a993, as docs/driver.md's OpenSandbox section states): a command's output is
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
// The lifecycle server behaves as the real one (server/ of OpenSandbox at
// 3bb6fad3, Docker runtime) was measured to, by default: create answers
// 202 with state Running before execd listens, and for ListenAfter (200
// ms) connections to execd are accepted and dropped, never refused; a
// delete kills the sandbox's processes, answers GET with state Failed for
// FailedFor (150 ms), then removes it (404); a snapshot pauses every
// process of the sandbox, execd included, for as long as it takes (one
// alone SnapshotWork, 1.25 s; several at once share the server's capacity,
// so each takes longer), execs sent meanwhile wait, and one command stream
// in flight at the thaw ends there without its final event; a snapshot a
// sandbox was made from cannot be deleted while that sandbox exists (409
// SNAPSHOT::DELETE_CONFLICT, the snapshot left Deleting; the same delete
// answers 204 once the sandbox is gone); a second snapshot with a name
// already used is a new snapshot; sandboxes and snapshots can be listed,
// filtered by metadata or by source sandbox and name.
//
// Fault modes reproduce what else a client must survive: a finished
// background command reported as running for a while (SetLateCompletion),
// command ids forgotten (ForgetCommandIDs) or execd restarting, which also
// drops its connections and refuses new ones for a while (RestartExecd),
// the connection of a command's stream dropped mid-stream (DropStreams),
// and a command's stream ended cleanly without its final event
// (EndStreams).
package execd

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
	"net/url"
	"os"
	"path/filepath"
	"slices"
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
	// ReadyAfter is how long a new sandbox stays Pending (0: not at all:
	// the create's answer says Running, as the real server's does).
	ReadyAfter time.Duration
	// ListenAfter is how long after a sandbox reports Running its execd
	// accepts connections and drops them (end of file or reset, never
	// refused) before it serves (0: 200 ms, as measured; negative: none).
	ListenAfter time.Duration
	// FailedFor is how long a deleted sandbox, its processes killed, still
	// answers GET with state Failed before it is gone (0: 150 ms, within
	// the 50 - 250 ms measured; negative: none).
	FailedFor time.Duration
	// SnapshotWork is how long a snapshot takes when it is the only one:
	// the sandbox is frozen all along (0: 1.25 s, the real server's
	// commit of 8 sessions took a median 10.2 s; negative: no freeze).
	SnapshotWork time.Duration
	// SnapshotCapacity is how many snapshots the server takes at full
	// speed at once; more share that capacity equally (0: 1, as measured:
	// 8 at once took each 5.8 - 14.7 s).
	SnapshotCapacity int
	// SnapshotAfter is how long after the thaw a snapshot stays Creating
	// (default none).
	SnapshotAfter time.Duration
	// EndAtThaw is how many foreground command streams in flight when a
	// snapshot thaws their sandbox end there, cleanly, without their
	// final event (0: 1, as the real server did once right after a
	// commit; negative: none).
	EndAtThaw int
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
	freezes   []Freeze
	machine   string
	shimDir   string
	closed    bool
	quit      chan struct{} // closed by Close
	wg        sync.WaitGroup
	queue     *snapshotQueue
}

type snapshot struct {
	id, sandboxID, name, state string
	created                    time.Time
}

// dropRule is a DropStreams (clean false) or EndStreams (clean true) rule.
type dropRule struct {
	match func(string) bool
	left  int
	when  DropPoint
	clean bool
}

// Freeze is one snapshot's pause of a sandbox, as the fake took it.
type Freeze struct {
	// SandboxID is the sandbox frozen; SnapshotID the snapshot taken.
	SandboxID, SnapshotID string
	// Start and End bound the freeze; Processes is how many processes
	// it stopped.
	Start, End time.Time
	Processes  int
}

type fakeSandbox struct {
	id         string
	name       string
	state      string
	reason     string
	message    string
	image      string
	snapshotID string
	metadata   map[string]string
	created    time.Time
	expires    time.Time
	renewals   []time.Time
	execd      *execd
	// deleted is closed once a delete removed the sandbox (nil while
	// none is under way).
	deleted chan struct{}
	// snapMu takes the sandbox's snapshots one at a time (each pauses it).
	snapMu sync.Mutex
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
	if opt.ListenAfter == 0 {
		opt.ListenAfter = 200 * time.Millisecond
	}
	if opt.FailedFor == 0 {
		opt.FailedFor = 150 * time.Millisecond
	}
	if opt.SnapshotWork == 0 {
		opt.SnapshotWork = 1250 * time.Millisecond
	}
	if opt.SnapshotCapacity <= 0 {
		opt.SnapshotCapacity = 1
	}
	if opt.EndAtThaw == 0 {
		opt.EndAtThaw = 1
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
	s.queue = newSnapshotQueue(opt.SnapshotCapacity, s.quit)
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
// whose command match accepts, at when: the client's read fails.
func (s *Server) DropStreams(match func(command string) bool, n int, when DropPoint) {
	s.mu.Lock()
	s.drops = append(s.drops, dropRule{match: match, left: n, when: when})
	s.mu.Unlock()
}

// EndStreams ends the next n foreground command streams whose command
// match accepts at when, cleanly (the reply is complete as HTTP) but
// without the command's final event, as a real stream once ended right
// after a snapshot: after init the command goes on; before the end it has
// finished and every output event was sent.
func (s *Server) EndStreams(match func(command string) bool, n int, when DropPoint) {
	s.mu.Lock()
	s.drops = append(s.drops, dropRule{match: match, left: n, when: when, clean: true})
	s.mu.Unlock()
}

// takeDrop says whether the command's stream is to be dropped or ended
// early (DropStreams, EndStreams), when, and whether cleanly.
func (s *Server) takeDrop(command string) (drop bool, when DropPoint, clean bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.drops {
		d := &s.drops[i]
		if d.left > 0 && d.match(command) {
			d.left--
			return true, d.when, d.clean
		}
	}
	return false, 0, false
}

// Freezes lists the snapshots' freezes of sandboxes, in the order they
// ended.
func (s *Server) Freezes() []Freeze {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Freeze(nil), s.freezes...)
}

// State is the sandbox's state as GET answers it ("" once it is gone).
func (s *Server) State(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil {
		return sb.state
	}
	return ""
}

// Dropped counts the connections to the sandbox's execd that were
// accepted and dropped (before it listened, or after it was killed).
func (s *Server) Dropped(id string) int {
	sb := s.get(id)
	if sb == nil {
		return 0
	}
	sb.execd.mu.Lock()
	pt := sb.execd.port
	sb.execd.mu.Unlock()
	if pt == nil {
		return 0
	}
	return pt.droppedCount()
}

// SnapshotState is the snapshot's state ("" once it is gone).
func (s *Server) SnapshotState(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sn := s.snapshots[id]; sn != nil {
		return sn.state
	}
	return ""
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

// Downloads counts the files read from the sandbox (GET /files/download).
func (s *Server) Downloads(id string) int {
	sb := s.get(id)
	if sb == nil {
		return 0
	}
	sb.execd.mu.Lock()
	defer sb.execd.mu.Unlock()
	return sb.execd.downloads
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

// Delete deletes a sandbox as DELETE /sandboxes/{id} does on the real
// server: execd stops (its port still accepts and drops connections),
// every process in it is killed, GET answers state Failed for FailedFor,
// then it is gone and its folder removed. A delete of a sandbox being
// deleted waits for that one.
func (s *Server) Delete(id string) error {
	s.mu.Lock()
	sb := s.sandboxes[id]
	if sb == nil {
		s.mu.Unlock()
		return fmt.Errorf("fakeexecd: %w %s", errNoSandbox, id)
	}
	if sb.deleted != nil {
		s.mu.Unlock()
		<-sb.deleted
		return nil
	}
	sb.deleted = make(chan struct{})
	// The container is killed: it reports Failed as its processes, execd
	// among them, die.
	sb.state, sb.reason, sb.message = "Failed", "CONTAINER_EXITED_ERROR", "the container exited with code 137"
	s.mu.Unlock()
	sb.execd.kill()
	KillIn(s.store.HostPath(id), s.store.MountPoint())
	if d := s.opt.FailedFor; d > 0 {
		select {
		case <-time.After(d):
		case <-s.quit:
		}
	}
	s.mu.Lock()
	delete(s.sandboxes, id)
	s.mu.Unlock()
	sb.execd.release()
	err := s.store.Remove(context.Background(), id)
	close(sb.deleted)
	return err
}

// errNoSandbox is a sandbox id the server does not know.
var errNoSandbox = errors.New("no sandbox")

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
	mux.HandleFunc("GET /v1/sandboxes", s.listSandboxes)
	mux.HandleFunc("GET /v1/snapshots", s.listSnapshots)
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
	if sb.message != "" {
		out.Status["message"] = sb.message
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
	// execd is not listening yet: its port accepts and drops until it is.
	if err := sb.execd.listen("", true); err != nil {
		_ = s.store.Remove(context.Background(), id)
		apiError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "start execd: %v", err)
		return
	}
	failed := strings.HasPrefix(sb.image, "fail")
	running := func() {
		// (s.mu held)
		if sb.state != "Pending" {
			return
		}
		sb.state = "Running"
		if failed {
			sb.state, sb.reason = "Failed", "image_pull_error"
			return
		}
		if d := s.opt.ListenAfter; d > 0 {
			s.after(d, func() { sb.execd.serve() })
		} else {
			sb.execd.serve()
		}
	}
	s.mu.Lock()
	s.sandboxes[id] = sb
	if s.opt.ReadyAfter <= 0 && !failed {
		running()
	}
	pending := sb.state == "Pending"
	s.mu.Unlock()
	if pending {
		d := s.opt.ReadyAfter
		if d <= 0 {
			d = 100 * time.Millisecond
		}
		s.after(d, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			running()
		})
	}
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
	if err := s.Delete(r.PathValue("id")); errors.Is(err, errNoSandbox) {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "sandbox %s not found", r.PathValue("id"))
		return
	} else if err != nil {
		apiError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "delete sandbox %s: %v", r.PathValue("id"), err)
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
	out := snapJSON(snap)
	s.mu.Unlock()
	// As the Docker runtime: the commit runs after the answer, with the
	// sandbox paused all along.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.take(sb, snap)
	}()
	reply(w, http.StatusAccepted, out)
}

// take takes the snapshot: it freezes the sandbox (its processes and its
// execd), copies its folder, holds it while the server's snapshot
// capacity does SnapshotWork for it, thaws it, and reports the snapshot
// Ready SnapshotAfter later (Failed if the copy failed).
func (s *Server) take(sb *fakeSandbox, snap *snapshot) {
	sb.snapMu.Lock()
	defer sb.snapMu.Unlock()
	var fz *frozen
	if s.opt.SnapshotWork > 0 {
		sb.execd.freeze()
		fz = freezeProcs(s.store.HostPath(sb.id), s.store.MountPoint())
	}
	err := s.store.Snapshot(context.Background(), sb.id, snap.id)
	s.queue.work(s.opt.SnapshotWork, &s.wg)
	if fz != nil {
		n := len(fz.fds)
		start := fz.start
		sb.execd.thaw(s.opt.EndAtThaw) // cuts the streams in flight first
		fz.thaw()
		s.mu.Lock()
		s.freezes = append(s.freezes, Freeze{SandboxID: sb.id, SnapshotID: snap.id, Start: start, End: time.Now(), Processes: n})
		s.mu.Unlock()
	}
	if d := s.opt.SnapshotAfter; d > 0 {
		select {
		case <-time.After(d):
		case <-s.quit:
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		snap.state = "Failed"
		s.opt.Log.Warn("fakeexecd: snapshot failed", "sandbox", sb.id, "snapshot", snap.id, "err", err)
		return
	}
	snap.state = "Ready"
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

// deleteSnapshot deletes a snapshot as the real server does: one still
// being created is a conflict; one a sandbox was made from, while that
// sandbox exists (the fork's container uses the snapshot's image), is 409
// SNAPSHOT::DELETE_CONFLICT and is left Deleting; the same delete answers
// 204 once no such sandbox is left.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	sn := s.snapshots[id]
	if sn == nil {
		s.mu.Unlock()
		apiError(w, http.StatusNotFound, "NOT_FOUND", "snapshot %s not found", id)
		return
	}
	if sn.state == "Creating" {
		s.mu.Unlock()
		apiError(w, http.StatusConflict, "CONFLICT", "snapshot %s is still being created", id)
		return
	}
	var users []string
	for _, sb := range s.sandboxes {
		if sb.snapshotID == id {
			users = append(users, sb.id)
		}
	}
	if len(users) > 0 {
		sn.state = "Deleting"
		s.mu.Unlock()
		sort.Strings(users)
		apiError(w, http.StatusConflict, "SNAPSHOT::DELETE_CONFLICT", "snapshot %s is used by sandbox %s", id, strings.Join(users, ", "))
		return
	}
	delete(s.snapshots, id)
	s.mu.Unlock()
	if err := s.store.RemoveSnapshot(r.Context(), id); err != nil && !errors.Is(err, os.ErrNotExist) {
		apiError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "%v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// page cuts items to the page the query asks for (page from 1, pageSize
// default 20, at most 200) and answers them with the pagination block.
func page[T any](w http.ResponseWriter, r *http.Request, items []T) {
	q := r.URL.Query()
	pg, size := 1, 20
	if v := q.Get("page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "page %q is not a number from 1", v)
			return
		}
		pg = n
	}
	if v := q.Get("pageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 200 {
			apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "pageSize %q is not a number from 1 to 200", v)
			return
		}
		size = n
	}
	total := len(items)
	from := min((pg-1)*size, total)
	to := min(from+size, total)
	pages := (total + size - 1) / size
	reply(w, http.StatusOK, map[string]any{
		"items": items[from:to],
		"pagination": map[string]any{"page": pg, "pageSize": size, "totalItems": total,
			"totalPages": pages, "hasNextPage": pg < pages},
	})
}

// listSandboxes is GET /sandboxes: filtered by metadata (one query value
// holding k=v pairs joined by &, URL-encoded) and by state, ordered by
// creation.
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	want, err := url.ParseQuery(r.URL.Query().Get("metadata"))
	if err != nil {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "metadata: %v", err)
		return
	}
	states := r.URL.Query()["state"]
	s.mu.Lock()
	var out []sandboxJSON
	for _, sb := range s.sandboxes {
		ok := len(states) == 0 || slices.Contains(states, sb.state)
		for k := range want {
			ok = ok && sb.metadata[k] == want.Get(k)
		}
		if ok {
			out = append(out, s.describe(sb))
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		return out[i].CreatedAt.Before(out[j].CreatedAt) || out[i].CreatedAt.Equal(out[j].CreatedAt) && out[i].ID < out[j].ID
	})
	page(w, r, out)
}

// listSnapshots is GET /snapshots, filtered by sandboxId, name and state.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	states := q["state"]
	s.mu.Lock()
	var found []*snapshot
	for _, sn := range s.snapshots {
		if (q.Get("sandboxId") == "" || sn.sandboxID == q.Get("sandboxId")) && (q.Get("name") == "" || sn.name == q.Get("name")) &&
			(len(states) == 0 || slices.Contains(states, sn.state)) {
			found = append(found, sn)
		}
	}
	sort.Slice(found, func(i, j int) bool {
		return found[i].created.Before(found[j].created) || found[i].created.Equal(found[j].created) && found[i].id < found[j].id
	})
	out := make([]map[string]any, len(found))
	for i, sn := range found {
		out[i] = snapJSON(sn)
	}
	s.mu.Unlock()
	page(w, r, out)
}
