package execd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// execd is one sandbox's fake execd.
type execd struct {
	s     *Server
	id    string
	token string

	mu       sync.Mutex
	addr     string // host:port it serves on
	port     *port
	hs       *http.Server
	down     bool
	cmds     map[string]*command
	log      []string
	uploads  []string
	shutDown bool
	// foreground and background count the commands run; downloads the
	// files read.
	foreground, background, downloads int
	// gate is non-nil while a snapshot freezes the sandbox: requests and
	// events wait until it is closed. dead is closed once execd is
	// killed, ending every such wait.
	gate chan struct{}
	dead chan struct{}
	// flights are the foreground streams waiting for their final event.
	flights map[*flight]struct{}
}

// flight is a foreground stream waiting for its command's final event; a
// thaw may cut it (closing cut) so that it ends without one.
type flight struct {
	start time.Time
	cut   chan struct{}
}

// command is one command execd ran.
type command struct {
	id         string
	content    string
	background bool
	pgid       int
	started    time.Time
	// output is the background command's merged output file.
	output string

	mu       sync.Mutex
	finished time.Time
	exitCode *int
	errText  string
	done     chan struct{}
}

func newExecd(s *Server, id string) *execd {
	return &execd{s: s, id: id, token: newID("tok-"), cmds: map[string]*command{}, dead: make(chan struct{}), flights: map[*flight]struct{}{}}
}

func (e *execd) address() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addr
}

// listen serves on addr ("" or taken: a free port); with drop, its port
// accepts and drops every connection until serve.
func (e *execd) listen(addr string, drop bool) error {
	var ln net.Listener
	var err error
	if addr != "" {
		ln, err = net.Listen("tcp", addr)
	}
	if addr == "" || err != nil {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		return err
	}
	pt := newPort(ln, drop)
	hs := &http.Server{Handler: e.handler(), ReadHeaderTimeout: 30 * time.Second}
	e.mu.Lock()
	if e.shutDown {
		e.mu.Unlock()
		pt.close()
		return errors.New("execd is shut down")
	}
	e.port, e.hs, e.addr, e.down = pt, hs, ln.Addr().String(), false
	e.mu.Unlock()
	go hs.Serve(pt.listener())
	return nil
}

// serve ends the create-then-listen window: execd answers from now on.
func (e *execd) serve() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.port != nil && !e.shutDown {
		e.port.setDrop(false)
	}
}

// kill is execd dying with its container (a delete): every connection is
// closed, and its port goes on accepting and dropping connections until
// release (the container is not removed yet).
func (e *execd) kill() {
	e.mu.Lock()
	if !e.shutDown {
		e.shutDown = true
		close(e.dead)
	}
	hs, pt := e.hs, e.port
	if pt != nil {
		pt.setDrop(true)
	}
	e.mu.Unlock()
	if hs != nil {
		hs.Close()
	}
}

// release closes the port of a killed execd (the container is removed):
// connections are refused from now on.
func (e *execd) release() {
	e.mu.Lock()
	pt := e.port
	e.mu.Unlock()
	if pt != nil {
		pt.close()
	}
}

// shutdown stops execd for good (the server closes).
func (e *execd) shutdown() {
	e.kill()
	e.release()
}

// freeze holds every request and event of execd until thaw.
func (e *execd) freeze() {
	e.mu.Lock()
	if e.gate == nil {
		e.gate = make(chan struct{})
	}
	e.mu.Unlock()
}

// thaw ends up to cut of the foreground streams still waiting for their
// final event, oldest first, without it, and then lets execd go on. The
// streams are cut while the gate still holds every event, and the caller
// continues the sandbox's processes only after: a command that ends once
// continued cannot slip its final event past its cut.
func (e *execd) thaw(cut int) {
	e.mu.Lock()
	var fls []*flight
	for fl := range e.flights {
		fls = append(fls, fl)
	}
	sort.Slice(fls, func(i, j int) bool { return fls[i].start.Before(fls[j].start) })
	for i, fl := range fls {
		if i >= cut {
			break
		}
		delete(e.flights, fl)
		close(fl.cut)
	}
	gate := e.gate
	e.gate = nil
	e.mu.Unlock()
	if gate != nil {
		close(gate)
	}
}

// waitThawed returns once the sandbox is not frozen (or execd is dead).
func (e *execd) waitThawed() {
	for {
		e.mu.Lock()
		gate := e.gate
		e.mu.Unlock()
		if gate == nil {
			return
		}
		select {
		case <-gate:
		case <-e.dead:
			return
		}
	}
}

// takeOff registers a foreground stream that waits for its final event;
// land takes it off again and reports whether a thaw cut it meanwhile.
func (e *execd) takeOff() *flight {
	fl := &flight{start: time.Now(), cut: make(chan struct{})}
	e.mu.Lock()
	e.flights[fl] = struct{}{}
	e.mu.Unlock()
	return fl
}

func (e *execd) land(fl *flight) {
	e.mu.Lock()
	delete(e.flights, fl)
	e.mu.Unlock()
}

func (e *execd) forget() {
	e.mu.Lock()
	e.cmds = map[string]*command{}
	e.mu.Unlock()
}

// restart drops every connection, kills the foreground commands (their
// execd is gone), forgets every id, and serves again after down.
func (e *execd) restart(down time.Duration) error {
	e.mu.Lock()
	hs, addr, pt := e.hs, e.addr, e.port
	e.down = true
	cmds := e.cmds
	e.cmds = map[string]*command{}
	e.mu.Unlock()
	pt.close() // refused while it is down
	hs.Close()
	for _, cm := range cmds {
		if !cm.background && !cm.isDone() {
			_ = unix.Kill(-cm.pgid, unix.SIGKILL)
		}
	}
	time.Sleep(down)
	return e.listen(addr, false)
}

func (e *execd) commandLog() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.log...)
}

func (e *execd) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /command", e.runCommand)
	mux.HandleFunc("DELETE /command", e.interrupt)
	// GET /command/status/{id} and GET /command/{id}/logs.
	mux.HandleFunc("GET /command/{a}/{b}", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.PathValue("a") == "status":
			e.status(w, r, r.PathValue("b"))
		case r.PathValue("b") == "logs":
			e.logs(w, r, r.PathValue("a"))
		default:
			http.NotFound(w, r)
		}
	})
	mux.HandleFunc("POST /files/upload", e.upload)
	mux.HandleFunc("GET /files/download", e.download)
	proxy := "/proxy/" + strconv.Itoa(ExecdPort)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A frozen execd answers nothing until the thaw.
		e.waitThawed()
		if e.s.opt.Runtime == RuntimeKubernetes && r.Header.Get(SecureAccessHeader) != e.token {
			// As execd's token filter: a body of {"error": ...}.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "Unauthorized: invalid or missing header " + SecureAccessHeader})
			return
		}
		// execd's own reverse proxy: /proxy/44772/... is execd itself.
		if rest, ok := strings.CutPrefix(r.URL.Path, proxy); ok && (rest == "" || rest[0] == '/') {
			r2 := r.Clone(r.Context())
			r2.URL.Path = rest
			r2.URL.RawPath = ""
			r = r2
		}
		mux.ServeHTTP(w, r)
	})
}

type commandRequest struct {
	Command    string            `json:"command"`
	Cwd        string            `json:"cwd"`
	Background bool              `json:"background"`
	Timeout    int64             `json:"timeout"`
	UID        *int              `json:"uid"`
	GID        *int              `json:"gid"`
	Envs       map[string]string `json:"envs"`
}

// start starts the command in the sandbox's namespace: unshare, bind
// mount of the sandbox's folder at the mount point, cd, bash -c, in a
// process group of its own, with execd's whole environment (plus envs)
// and its output written to files, as execd does.
func (e *execd) start(req commandRequest, stdout, stderr *os.File) (*exec.Cmd, error) {
	s := e.s
	mp := s.store.MountPoint()
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	script := fmt.Sprintf("mount --bind %s %s || exit 125\ncd -- %s || exit 1\nexec bash -c %s",
		sandbox.Quote(s.store.HostPath(e.id)), sandbox.Quote(mp), sandbox.Quote(cwd), sandbox.Quote(req.Command))
	c := exec.Command("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script)
	c.Dir = "/"
	env := s.opt.Env
	if env == nil {
		env = os.Environ()
	}
	vars := map[string]string{}
	var order []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	s.mu.Lock()
	if s.shimDir != "" {
		p := vars["PATH"]
		if p == "" {
			p = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
		}
		if _, ok := vars["PATH"]; !ok {
			order = append(order, "PATH")
		}
		vars["PATH"] = s.shimDir + ":" + p
	}
	s.mu.Unlock()
	for k, v := range req.Envs {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, k := range order {
		c.Env = append(c.Env, k+"="+vars[k])
	}
	c.Stdin = nil
	c.Stdout, c.Stderr = stdout, stderr
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		return nil, err
	}
	return c, nil
}

// outcome is what execd reports of a command that ended: the exit code
// as Go's ExitCode (-1 for a signal), the error text ("exit status 3",
// "signal: killed"), ok for a zero exit.
func outcome(werr error) (code int, text string, ok bool) {
	if werr == nil {
		return 0, "", true
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		return ee.ExitCode(), werr.Error(), false
	}
	return 1, werr.Error(), false
}

type event struct {
	Type          string         `json:"type"`
	Text          string         `json:"text,omitempty"`
	Timestamp     int64          `json:"timestamp"`
	ExecutionTime int64          `json:"execution_time,omitempty"`
	Error         map[string]any `json:"error,omitempty"`
}

// Event types.
const (
	EventInit     = "init"
	EventStdout   = "stdout"
	EventStderr   = "stderr"
	EventError    = "error"
	EventComplete = "execution_complete"
	EventPing     = "ping"
)

// stream writes a command's events to its response while the client
// reads it: a write that fails marks it dead, and once the handler is done
// with the response (close) nothing is written any more.
type stream struct {
	e    *execd
	mu   sync.Mutex
	w    http.ResponseWriter
	dead bool
}

func (st *stream) send(ev event) {
	// Nothing is written while the sandbox is frozen.
	st.e.waitThawed()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.dead {
		return
	}
	ev.Timestamp = time.Now().UnixMilli()
	b, _ := json.Marshal(ev) // invalid UTF-8 becomes U+FFFD, as in execd
	if _, err := st.w.Write(append(b, '\n', '\n')); err != nil {
		st.dead = true
		return
	}
	if f, ok := st.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (st *stream) close() {
	st.mu.Lock()
	st.dead = true
	st.mu.Unlock()
}

// ping sends a ping right away and every PingInterval until stop.
func (e *execd) ping(st *stream, stop <-chan struct{}) {
	t := time.NewTicker(e.s.opt.PingInterval)
	defer t.Stop()
	for {
		st.send(event{Type: EventPing, Text: "pong"})
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// linger is execd's graceful-shutdown sleep after a command's final event.
func (e *execd) linger() {
	if d := e.s.opt.GracefulDelay; d > 0 {
		select {
		case <-time.After(d):
		case <-e.s.quit:
		}
	}
}

// register logs a command and makes its record; enroll makes its id known.
func (e *execd) register(req commandRequest) *command {
	cm := &command{id: newID("cmd-"), content: req.Command, background: req.Background, started: time.Now().UTC(), done: make(chan struct{})}
	e.mu.Lock()
	e.log = append(e.log, req.Command)
	if req.Background {
		e.background++
	} else {
		e.foreground++
	}
	e.mu.Unlock()
	return cm
}

// logFiles makes the files a command's output goes to (outside the
// sandbox, as execd's are in its own temp folder).
func (e *execd) logFiles(cm *command, names ...string) ([]*os.File, error) {
	dir := filepath.Join(e.s.opt.Base, ".execd-logs", e.id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var out []*os.File
	for _, n := range names {
		f, err := os.OpenFile(filepath.Join(dir, cm.id+"."+n), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

func (e *execd) runCommand(w http.ResponseWriter, r *http.Request) {
	var req commandRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Command == "" {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "want {\"command\": ...}")
		return
	}
	if req.Background {
		e.runBackground(w, req)
		return
	}
	cm := e.register(req)
	drop, when, clean := e.s.takeDrop(req.Command)
	files, err := e.logFiles(cm, "stdout", "stderr")
	if err != nil {
		apiError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "the output files: %v", err)
		return
	}
	c, err := e.start(req, files[0], files[1])
	if err != nil {
		files[0].Close()
		files[1].Close()
		apiError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "start the command: %v", err)
		return
	}
	cm.pgid = c.Process.Pid
	e.enroll(cm) // a foreground command is known at once
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	st := &stream{e: e, w: w}
	st.send(event{Type: EventInit, Text: cm.id})
	stopPing := make(chan struct{})
	go e.ping(st, stopPing)
	stop := sync.OnceFunc(func() { close(stopPing) })
	defer stop()

	// The command is followed apart from the request: a client that goes
	// away does not end it (execd runs it under a background context).
	final := make(chan event, 1)
	e.s.wg.Add(1)
	go func() {
		defer e.s.wg.Done()
		defer files[0].Close()
		defer files[1].Close()
		exited := make(chan struct{})
		var tails sync.WaitGroup
		for _, f := range []struct{ kind, path string }{{EventStdout, files[0].Name()}, {EventStderr, files[1].Name()}} {
			tails.Add(1)
			go func() {
				defer tails.Done()
				tailFile(f.path, e.s.opt.PollInterval, func(text string) { st.send(event{Type: f.kind, Text: text}) }, exited)
			}()
		}
		waited := make(chan error, 1)
		go func() { waited <- c.Wait() }()
		var werr error
		if req.Timeout > 0 {
			t := time.NewTimer(time.Duration(req.Timeout) * time.Millisecond)
			select {
			case werr = <-waited:
			case <-t.C:
				// As exec.CommandContext: the bash process alone is killed.
				_ = c.Process.Kill()
				werr = <-waited
			}
			t.Stop()
		} else {
			werr = <-waited
		}
		close(exited)
		tails.Wait()
		code, text, ok := outcome(werr)
		e.finish(cm, code, text)
		if ok {
			final <- event{Type: EventComplete, ExecutionTime: time.Since(cm.started).Milliseconds()}
			return
		}
		final <- event{Type: EventError, Error: map[string]any{"ename": "CommandExecError", "evalue": strconv.Itoa(code), "traceback": []string{text}}}
	}()
	if drop && when == DropAfterInit {
		st.close()
		if clean {
			return // a complete reply without the final event
		}
		panic(http.ErrAbortHandler)
	}
	fl := e.takeOff()
	var ev event
	select {
	case ev = <-final:
		e.land(fl)
	case <-fl.cut:
		// A thaw ended the stream here: the command goes on.
		st.close()
		return
	}
	if drop && when == DropBeforeEnd {
		st.close()
		if clean {
			return
		}
		panic(http.ErrAbortHandler)
	}
	st.send(ev)
	stop()
	e.linger()
	st.close()
}

func (e *execd) finish(cm *command, code int, why string) {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if !cm.finished.IsZero() {
		return
	}
	cm.finished = time.Now().UTC()
	cm.exitCode = &code
	cm.errText = why
	close(cm.done)
}

func (cm *command) isDone() bool {
	select {
	case <-cm.done:
		return true
	default:
		return false
	}
}

// runBackground answers init before the command is registered (its status
// is 404 for RegisterDelay), then execution_complete at once, then lingers
// as a foreground stream does.
func (e *execd) runBackground(w http.ResponseWriter, req commandRequest) {
	cm := e.register(req)
	files, err := e.logFiles(cm, "output")
	if err != nil {
		apiError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "the output file: %v", err)
		return
	}
	cm.output = files[0].Name()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	st := &stream{e: e, w: w}
	st.send(event{Type: EventInit, Text: cm.id})
	c, err := e.start(req, files[0], files[0])
	if err != nil {
		files[0].Close()
		e.finish(cm, 255, err.Error())
		e.enroll(cm)
		st.send(event{Type: EventComplete})
		return
	}
	cm.pgid = c.Process.Pid
	e.s.wg.Add(1)
	go func() {
		defer e.s.wg.Done()
		defer files[0].Close()
		if d := e.s.opt.RegisterDelay; d > 0 {
			time.Sleep(d)
		}
		e.enroll(cm)
	}()
	e.s.wg.Add(1)
	go func() {
		defer e.s.wg.Done()
		waited := make(chan error, 1)
		go func() { waited <- c.Wait() }()
		var werr error
		if req.Timeout > 0 {
			t := time.NewTimer(time.Duration(req.Timeout) * time.Millisecond)
			select {
			case werr = <-waited:
			case <-t.C:
				_ = unix.Kill(-cm.pgid, unix.SIGKILL)
				werr = <-waited
			}
			t.Stop()
		} else {
			werr = <-waited
		}
		code, text, _ := outcome(werr)
		e.finish(cm, code, text)
	}()
	st.send(event{Type: EventComplete})
	e.linger()
	st.close()
}

// enroll registers a background command (its status known from now on).
func (e *execd) enroll(cm *command) {
	e.mu.Lock()
	if !e.down {
		e.cmds[cm.id] = cm
	}
	e.mu.Unlock()
}

func (e *execd) lookup(id string) *command {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cmds[id]
}

func (e *execd) status(w http.ResponseWriter, r *http.Request, id string) {
	cm := e.lookup(id)
	if cm == nil {
		apiError(w, http.StatusNotFound, "INVALID_REQUEST", "command not found: %s", id)
		return
	}
	late := e.s.lateBy()
	cm.mu.Lock()
	defer cm.mu.Unlock()
	out := map[string]any{"id": cm.id, "session": cm.id, "content": cm.content, "running": true, "exit_code": nil,
		"started_at": cm.started, "finished_at": nil}
	if !cm.finished.IsZero() && time.Since(cm.finished) >= late {
		out["running"] = false
		out["exit_code"] = *cm.exitCode
		out["finished_at"] = cm.finished
		if cm.errText != "" {
			out["error"] = cm.errText
		}
	}
	reply(w, http.StatusOK, out)
}

func (e *execd) logs(w http.ResponseWriter, r *http.Request, id string) {
	cm := e.lookup(id)
	if cm == nil || cm.output == "" {
		// As execd: an unknown id on the logs endpoint is a bad request.
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "no command %s", id)
		return
	}
	cursor, _ := strconv.ParseInt(r.URL.Query().Get("cursor"), 10, 64)
	data, _ := os.ReadFile(cm.output)
	if cursor < 0 || cursor > int64(len(data)) {
		cursor = int64(len(data))
	}
	w.Header().Set(TailCursorHeader, strconv.Itoa(len(data)))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data[cursor:])
}

// interrupt is DELETE /command?id=: an unknown or finished id is 500 "no
// such session"; otherwise SIGTERM to the command's group, and, inside the
// request, SIGKILL InterruptGrace later.
func (e *execd) interrupt(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		apiError(w, http.StatusBadRequest, "MISSING_QUERY", "missing query parameter 'id'")
		return
	}
	cm := e.lookup(id)
	if cm == nil || cm.isDone() {
		apiError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error interruptting code context. no such session")
		return
	}
	_ = unix.Kill(-cm.pgid, unix.SIGTERM)
	select {
	case <-time.After(e.s.opt.InterruptGrace):
	case <-e.s.quit:
	}
	if !cm.isDone() {
		_ = unix.Kill(-cm.pgid, unix.SIGKILL)
	}
	w.WriteHeader(http.StatusOK)
}

func (e *execd) upload(w http.ResponseWriter, r *http.Request) {
	ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || ct != "multipart/form-data" {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "want multipart/form-data")
		return
	}
	mr, err := r.MultipartReader()
	if err != nil {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "%v", err)
		return
	}
	sb, err := e.s.store.Open(e.id)
	if err != nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "%v", err)
		return
	}
	n := 0
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "%v", err)
			return
		}
		if part.FormName() != "metadata" {
			apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "want a metadata part before each file, got %q", part.FormName())
			return
		}
		if part.FileName() == "" {
			// As execd: it reads the metadata only as a file part.
			apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "the metadata part must be sent as a file part")
			return
		}
		var meta struct {
			Path  string `json:"path"`
			Mode  int    `json:"mode"`
			Owner string `json:"owner"`
			Group string `json:"group"`
		}
		if err := json.NewDecoder(part).Decode(&meta); err != nil || meta.Path == "" {
			apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "bad metadata: %v", err)
			return
		}
		if meta.Mode == 0 {
			meta.Mode = 644
		}
		mode, err := strconv.ParseUint(strconv.Itoa(meta.Mode), 8, 32)
		if err != nil {
			apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "mode %d is not octal digits", meta.Mode)
			return
		}
		file, err := mr.NextPart()
		if err != nil || file.FormName() != "file" {
			apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "want a file part after the metadata")
			return
		}
		data, err := io.ReadAll(file)
		if err != nil {
			apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "%v", err)
			return
		}
		if err := sb.Upload(r.Context(), meta.Path, data, uint32(mode)); err != nil {
			apiError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "%v", err)
			return
		}
		e.mu.Lock()
		e.uploads = append(e.uploads, meta.Path)
		e.mu.Unlock()
		n++
	}
	if n == 0 {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "no file in the upload")
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *execd) download(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.downloads++
	e.mu.Unlock()
	sb, err := e.s.store.Open(e.id)
	if err != nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "%v", err)
		return
	}
	host, err := sb.HostPathOf(r.URL.Query().Get("path"))
	if err != nil {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "%v", err)
		return
	}
	f, err := os.Open(host)
	if err != nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "%s: no such file", r.URL.Query().Get("path"))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.IsDir() {
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "%s is not a file", r.URL.Query().Get("path"))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, path.Base(host), fi.ModTime(), f)
}
