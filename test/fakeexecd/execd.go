package fakeexecd

import (
	"bytes"
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
	"strconv"
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
	ln       net.Listener
	hs       *http.Server
	down     bool
	cmds     map[string]*command
	log      []string
	uploads  []string
	shutDown bool
	// foreground and background count the commands run.
	foreground, background int
}

// command is one command execd ran.
type command struct {
	id         string
	content    string
	background bool
	pgid       int
	started    time.Time

	mu       sync.Mutex
	finished time.Time
	exitCode *int
	errText  string
	output   bytes.Buffer // background: stdout and stderr merged
	done     chan struct{}
}

func newExecd(s *Server, id string) *execd {
	return &execd{s: s, id: id, token: newID("tok-"), cmds: map[string]*command{}}
}

func (e *execd) address() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addr
}

// listen serves on addr ("" or taken: a free port).
func (e *execd) listen(addr string) error {
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
	hs := &http.Server{Handler: e.handler(), ReadHeaderTimeout: 30 * time.Second}
	e.mu.Lock()
	if e.shutDown {
		e.mu.Unlock()
		ln.Close()
		return errors.New("execd is shut down")
	}
	e.ln, e.hs, e.addr, e.down = ln, hs, ln.Addr().String(), false
	e.mu.Unlock()
	go hs.Serve(ln)
	return nil
}

// shutdown stops execd for good (the sandbox is deleted).
func (e *execd) shutdown() {
	e.mu.Lock()
	e.shutDown = true
	hs := e.hs
	e.mu.Unlock()
	if hs != nil {
		hs.Close()
	}
}

func (e *execd) forget() {
	e.mu.Lock()
	e.cmds = map[string]*command{}
	e.mu.Unlock()
}

func (e *execd) restart(down time.Duration) error {
	e.mu.Lock()
	hs, addr := e.hs, e.addr
	e.down = true
	e.cmds = map[string]*command{}
	e.mu.Unlock()
	hs.Close() // every connection dropped; their commands are killed
	time.Sleep(down)
	return e.listen(addr)
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
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(AccessTokenHeader) != e.token {
			apiError(w, http.StatusUnauthorized, "UNAUTHORIZED", "missing or wrong %s", AccessTokenHeader)
			return
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
// process group of its own.
func (e *execd) start(req commandRequest, stdout, stderr io.Writer) (*exec.Cmd, error) {
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
	pathEnv := os.Getenv("PATH")
	if pathEnv == "" {
		pathEnv = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	s.mu.Lock()
	if s.shimDir != "" {
		pathEnv = s.shimDir + ":" + pathEnv
	}
	s.mu.Unlock()
	env := map[string]string{"PATH": pathEnv, "LANG": "C.UTF-8", "HOME": path.Join(mp, "home")}
	for k, v := range req.Envs {
		env[k] = v
	}
	for k, v := range env {
		c.Env = append(c.Env, k+"="+v)
	}
	c.Stdin = nil
	c.Stdout, c.Stderr = stdout, stderr
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.WaitDelay = 2 * time.Second
	if err := c.Start(); err != nil {
		return nil, err
	}
	return c, nil
}

func exitCodeOf(err error, c *exec.Cmd) int {
	if c.ProcessState == nil {
		return -1
	}
	if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled():
			return 128 + int(ws.Signal())
		case ws.Exited():
			return ws.ExitStatus()
		}
	}
	return -1
}

// eventWriter turns a command's output into events.
type eventWriter struct {
	kind string
	ch   chan<- event
	done <-chan struct{}
}

type event struct {
	Type          string         `json:"type"`
	Text          string         `json:"text,omitempty"`
	Timestamp     int64          `json:"timestamp"`
	ExecutionTime int64          `json:"execution_time,omitempty"`
	Error         map[string]any `json:"error,omitempty"`
}

func (w eventWriter) Write(p []byte) (int, error) {
	select {
	case w.ch <- event{Type: w.kind, Text: string(p), Timestamp: time.Now().UnixMilli()}:
	case <-w.done:
	}
	return len(p), nil
}

func (e *execd) register(req commandRequest) *command {
	cm := &command{id: newID("cmd-"), content: req.Command, background: req.Background, started: time.Now().UTC(), done: make(chan struct{})}
	e.mu.Lock()
	e.cmds[cm.id] = cm
	e.log = append(e.log, req.Command)
	if req.Background {
		e.background++
	} else {
		e.foreground++
	}
	e.mu.Unlock()
	return cm
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
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	send := func(ev event) {
		ev.Timestamp = time.Now().UnixMilli()
		_ = enc.Encode(ev)           // one line of JSON...
		_, _ = w.Write([]byte("\n")) // ...and a blank line
		if flusher != nil {
			flusher.Flush()
		}
	}
	cm := e.register(req)
	drop, when := e.s.takeDrop(req.Command)
	stop := make(chan struct{})
	ch := make(chan event, 64)
	c, err := e.start(req, eventWriter{EventStdout, ch, stop}, eventWriter{EventStderr, ch, stop})
	if err != nil {
		close(stop)
		apiError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "start the command: %v", err)
		return
	}
	cm.pgid = c.Process.Pid
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	send(event{Type: EventInit, Text: cm.id})
	killGroup := func() { _ = unix.Kill(-cm.pgid, unix.SIGKILL) }
	waited := make(chan error, 1)
	go func() { waited <- c.Wait() }()
	if drop && when == DropAfterInit {
		killGroup()
		close(stop)
		<-waited
		e.finish(cm, -1, "dropped")
		panic(http.ErrAbortHandler)
	}
	var timer <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(time.Duration(req.Timeout) * time.Millisecond)
		defer t.Stop()
		timer = t.C
	}
	timedOut := false
	var werr error
loop:
	for {
		select {
		case ev := <-ch:
			send(ev)
		case werr = <-waited:
			break loop
		case <-timer:
			timedOut = true
			killGroup()
			timer = nil
		case <-r.Context().Done():
			// The client went away: execd kills the command's group.
			killGroup()
			close(stop)
			<-waited
			e.finish(cm, -1, "request cancelled")
			return
		}
	}
	close(stop)
	for {
		select {
		case ev := <-ch:
			send(ev)
			continue
		default:
		}
		break
	}
	code := exitCodeOf(werr, c)
	e.finish(cm, code, "")
	if drop && when == DropBeforeEnd {
		panic(http.ErrAbortHandler)
	}
	elapsed := time.Since(cm.started).Milliseconds()
	switch {
	case timedOut:
		send(event{Type: EventError, Error: map[string]any{"ename": "TimeoutError", "evalue": strconv.Itoa(code),
			"traceback": []string{fmt.Sprintf("the command ran out of its %d ms", req.Timeout)}}})
	case code != 0:
		send(event{Type: EventError, Error: map[string]any{"ename": "CommandExecError", "evalue": strconv.Itoa(code), "traceback": []string{}}})
	default:
		send(event{Type: EventComplete, ExecutionTime: elapsed})
	}
}

// Event types.
const (
	EventInit     = "init"
	EventStdout   = "stdout"
	EventStderr   = "stderr"
	EventError    = "error"
	EventComplete = "execution_complete"
)

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

// lockedWriter appends to a command's merged output.
type lockedWriter struct{ cm *command }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.cm.mu.Lock()
	defer w.cm.mu.Unlock()
	return w.cm.output.Write(p)
}

func (e *execd) runBackground(w http.ResponseWriter, req commandRequest) {
	cm := e.register(req)
	c, err := e.start(req, lockedWriter{cm}, lockedWriter{cm})
	if err != nil {
		apiError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "start the command: %v", err)
		return
	}
	cm.pgid = c.Process.Pid
	e.s.wg.Add(1)
	go func() {
		defer e.s.wg.Done()
		var timer <-chan time.Time
		if req.Timeout > 0 {
			t := time.NewTimer(time.Duration(req.Timeout) * time.Millisecond)
			defer t.Stop()
			timer = t.C
		}
		waited := make(chan error, 1)
		go func() { waited <- c.Wait() }()
		var werr error
		select {
		case werr = <-waited:
		case <-timer:
			_ = unix.Kill(-cm.pgid, unix.SIGKILL)
			werr = <-waited
		}
		e.finish(cm, exitCodeOf(werr, c), "")
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	b, _ := json.Marshal(event{Type: EventInit, Text: cm.id, Timestamp: time.Now().UnixMilli()})
	_, _ = w.Write(append(b, '\n', '\n'))
}

func (e *execd) lookup(id string) *command {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cmds[id]
}

func (e *execd) status(w http.ResponseWriter, r *http.Request, id string) {
	cm := e.lookup(id)
	if cm == nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "command %s not found", id)
		return
	}
	late := e.s.lateBy()
	cm.mu.Lock()
	defer cm.mu.Unlock()
	out := map[string]any{"id": cm.id, "content": cm.content, "running": true, "exit_code": nil,
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
	if cm == nil {
		// As execd: an unknown id on the logs endpoint is a bad request.
		apiError(w, http.StatusBadRequest, "INVALID_REQUEST", "no command %s", id)
		return
	}
	cursor, _ := strconv.ParseInt(r.URL.Query().Get("cursor"), 10, 64)
	cm.mu.Lock()
	data := cm.output.Bytes()
	if cursor < 0 || cursor > int64(len(data)) {
		cursor = int64(len(data))
	}
	out := append([]byte(nil), data[cursor:]...)
	next := len(data)
	cm.mu.Unlock()
	w.Header().Set(TailCursorHeader, strconv.Itoa(next))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

func (e *execd) interrupt(w http.ResponseWriter, r *http.Request) {
	cm := e.lookup(r.URL.Query().Get("id"))
	if cm == nil {
		apiError(w, http.StatusNotFound, "NOT_FOUND", "command %s not found", r.URL.Query().Get("id"))
		return
	}
	select {
	case <-cm.done:
		apiError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "command %s is not running", cm.id)
		return
	default:
	}
	_ = unix.Kill(-cm.pgid, unix.SIGTERM)
	e.s.wg.Add(1)
	go func() {
		defer e.s.wg.Done()
		select {
		case <-cm.done:
		case <-time.After(3 * time.Second):
			_ = unix.Kill(-cm.pgid, unix.SIGKILL)
		}
	}()
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
