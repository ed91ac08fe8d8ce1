package opensandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// AccessTokenHeader is the header execd itself checks when it was started
// with an access token. The client sends whatever headers the endpoint
// lookup names: none on the server's Docker runtime (whose endpoint is
// host:port/proxy/44772, execd's own reverse proxy), SecureAccessHeader on
// its Kubernetes runtime.
const AccessTokenHeader = "X-EXECD-ACCESS-TOKEN"

// SecureAccessHeader is the header the Kubernetes runtime's endpoint
// lookup names, with the sandbox's token.
const SecureAccessHeader = "OpenSandbox-Secure-Access"

// StartGrace is how long after a background command's init a 404 from its
// status is taken for execd not having registered it yet (it sends init
// first), and asked again.
const StartGrace = 2 * time.Second

// TailCursorHeader carries the next cursor of a logs read.
const TailCursorHeader = "EXECD-COMMANDS-TAIL-CURSOR"

// Event types of a command's stream.
const (
	EventInit     = "init"
	EventStdout   = "stdout"
	EventStderr   = "stderr"
	EventError    = "error"
	EventComplete = "execution_complete"
	EventPing     = "ping"
	EventStatus   = "status"
)

// Execd is a client of one sandbox's execd. It sends Headers with every
// request (the endpoint lookup's headers, e.g. X-EXECD-ACCESS-TOKEN). It
// never retries: which calls may be repeated is the caller's decision.
type Execd struct {
	// URL is execd's address (a missing scheme means http).
	URL string
	// Headers are sent with every request.
	Headers map[string]string
	// HTTP is the client (nil: http.DefaultClient). Calls are bounded by
	// their contexts.
	HTTP *http.Client

	mu      sync.Mutex
	started map[string]time.Time // background commands this client started
}

// Command is the body of POST /command. Command runs under bash -c.
type Command struct {
	Command    string            `json:"command"`
	Cwd        string            `json:"cwd,omitempty"`
	Background bool              `json:"background,omitempty"`
	TimeoutMS  int64             `json:"timeout,omitempty"`
	UID        *int              `json:"uid,omitempty"`
	GID        *int              `json:"gid,omitempty"`
	Envs       map[string]string `json:"envs,omitempty"`
}

// Event is one event of a command's stream.
type Event struct {
	Type          string       `json:"type"`
	Text          string       `json:"text,omitempty"`
	Timestamp     int64        `json:"timestamp,omitempty"`
	ExecutionTime int64        `json:"execution_time,omitempty"`
	Error         *ErrorDetail `json:"error,omitempty"`
}

// ErrorDetail is an error event's details; a command that exited non-zero
// has its exit code in EValue.
type ErrorDetail struct {
	EName     string   `json:"ename,omitempty"`
	EValue    string   `json:"evalue,omitempty"`
	Traceback []string `json:"traceback,omitempty"`
}

// Result is what a foreground command's stream said.
type Result struct {
	// ID is the command id (the init event's text).
	ID string
	// ExitCode is the error event's evalue, or 0 on execution_complete
	// (-1 when the error event carries no number).
	ExitCode int
	// Stdout and Stderr are the output events' texts.
	Stdout, Stderr []byte
	// Error is the error event, if any.
	Error *ErrorDetail
}

// CommandStatus is GET /command/status/{id}.
type CommandStatus struct {
	ID         string     `json:"id"`
	Content    string     `json:"content,omitempty"`
	Running    bool       `json:"running"`
	ExitCode   *int       `json:"exit_code"`
	Error      string     `json:"error,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// FileMetadata is the metadata part of an upload. Mode holds the octal
// digits as a decimal number (0o755 is 755), as execd reads it.
type FileMetadata struct {
	Path  string `json:"path"`
	Mode  int    `json:"mode,omitempty"`
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
}

// OctalDigits turns a file mode into the number execd expects (0o755 ->
// 755).
func OctalDigits(mode uint32) int {
	n, _ := strconv.Atoi(strconv.FormatUint(uint64(mode&0o7777), 8))
	return n
}

// ParseOctalDigits is OctalDigits backwards (755 -> 0o755).
func ParseOctalDigits(n int) (uint32, error) {
	m, err := strconv.ParseUint(strconv.Itoa(n), 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("mode %d is not octal digits", n)
	}
	return uint32(m), nil
}

func (e *Execd) client() *http.Client {
	if e.HTTP != nil {
		return e.HTTP
	}
	return http.DefaultClient
}

func (e *Execd) request(ctx context.Context, method, p string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, joinURL(e.URL, p), body)
	if err != nil {
		return nil, err
	}
	for k, v := range e.Headers {
		req.Header.Set(k, v)
	}
	return req, nil
}

// do sends req; a reply other than ok is a *StatusError (404: notFound).
func (e *Execd) do(ctx context.Context, req *http.Request, what string, notFound error, ok ...int) (*http.Response, error) {
	resp, err := e.client().Do(req)
	if err != nil {
		return nil, transportError(ctx, what, err, false)
	}
	for _, c := range ok {
		if resp.StatusCode == c {
			return resp, nil
		}
	}
	defer resp.Body.Close()
	return nil, statusError(what, resp, notFound)
}

// Ping checks that execd answers.
func (e *Execd) Ping(ctx context.Context) error {
	req, err := e.request(ctx, http.MethodGet, "/ping", nil)
	if err != nil {
		return err
	}
	resp, err := e.do(ctx, req, "GET /ping", nil, http.StatusOK)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// stream posts cmd and calls fn for every event of the reply until the
// stream ends (nil), fn says stop, or the connection fails (an error: a
// *TransportError once the request was sent).
func (e *Execd) stream(ctx context.Context, cmd Command, fn func(Event) bool) error {
	body, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	req, err := e.request(ctx, http.MethodPost, "/command", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := e.do(ctx, req, "POST /command", nil, http.StatusOK)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return readEvents(resp.Body, func(ev Event) bool { return fn(ev) }, func(err error) error {
		return transportError(ctx, "POST /command (reading its events)", err, true)
	})
}

// readEvents parses a stream of JSON events separated by blank lines. It
// also reads server-sent-event framing ("data: {...}" lines, comments and
// event: lines are skipped), since proxies and versions differ. A line
// that is not JSON is an error.
func readEvents(r io.Reader, fn func(Event) bool, wrap func(error) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf bytes.Buffer
	flush := func() (bool, error) {
		data := bytes.TrimSpace(buf.Bytes())
		buf.Reset()
		if len(data) == 0 {
			return true, nil
		}
		var ev Event
		if err := json.Unmarshal(data, &ev); err != nil {
			return false, fmt.Errorf("execd sent an event that is not JSON: %v (%.200q)", err, data)
		}
		return fn(ev), nil
	}
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			t := bytes.TrimRight(line, "\r\n")
			switch {
			case len(bytes.TrimSpace(t)) == 0:
				if goOn, ferr := flush(); ferr != nil || !goOn {
					return ferr
				}
			case t[0] == ':' || bytes.HasPrefix(t, []byte("event:")) || bytes.HasPrefix(t, []byte("id:")) || bytes.HasPrefix(t, []byte("retry:")):
			case bytes.HasPrefix(t, []byte("data:")):
				buf.Write(bytes.TrimPrefix(bytes.TrimPrefix(t, []byte("data:")), []byte(" ")))
				buf.WriteByte('\n')
			default:
				buf.Write(t)
				buf.WriteByte('\n')
				// One JSON object per line is also complete on its own.
				if json.Valid(bytes.TrimSpace(buf.Bytes())) {
					if goOn, ferr := flush(); ferr != nil || !goOn {
						return ferr
					}
				}
			}
		}
		if err == io.EOF {
			_, ferr := flush()
			return ferr
		}
		if err != nil {
			return wrap(err)
		}
	}
}

// ErrIncomplete means a command's stream ended before its end was
// reported (no execution_complete and no error event): the command's
// outcome is unknown. It wraps sandbox.ErrTransport.
var ErrIncomplete = fmt.Errorf("%w: the command's event stream ended before its end", sandbox.ErrTransport)

// collector turns a command's events into its Result.
type collector struct {
	res            Result
	done           bool
	stdout, stderr bytes.Buffer
}

func (c *collector) add(ev Event) {
	switch ev.Type {
	case EventInit:
		c.res.ID = ev.Text
	case EventStdout:
		c.stdout.WriteString(ev.Text)
	case EventStderr:
		c.stderr.WriteString(ev.Text)
	case EventError:
		c.done = true
		c.res.Error = ev.Error
		c.res.ExitCode = -1
		if ev.Error != nil {
			if n, err := strconv.Atoi(strings.TrimSpace(ev.Error.EValue)); err == nil {
				c.res.ExitCode = n
			}
		}
	case EventComplete:
		if !c.done {
			c.res.ExitCode = 0
		}
		c.done = true
	}
}

func (c *collector) result() Result {
	c.res.Stdout, c.res.Stderr = c.stdout.Bytes(), c.stderr.Bytes()
	return c.res
}

// ParseStream reads a whole foreground command's event stream into its
// Result; a stream without the command's end is ErrIncomplete.
func ParseStream(r io.Reader) (Result, error) {
	c := &collector{res: Result{ExitCode: -1}}
	err := readEvents(r, func(ev Event) bool { c.add(ev); return true }, func(err error) error { return err })
	if err != nil {
		return c.result(), err
	}
	if !c.done {
		return c.result(), ErrIncomplete
	}
	return c.result(), nil
}

// Run runs a foreground command and returns what its stream reported, as
// soon as the final event (execution_complete or error) came; ping events
// are ignored. The output events' texts are as execd sends them: one per
// line, line ends dropped (see Script for exact output). onEvent, if set,
// sees every event. A stream that breaks or ends without
// the command's end is an error wrapping sandbox.ErrTransport (the result
// so far is returned with it); a non-zero exit is not an error.
func (e *Execd) Run(ctx context.Context, cmd Command, onEvent func(Event)) (Result, error) {
	cmd.Background = false
	c := &collector{res: Result{ExitCode: -1}}
	err := e.stream(ctx, cmd, func(ev Event) bool {
		if onEvent != nil {
			onEvent(ev)
		}
		c.add(ev)
		// execd keeps the stream open a while after the final event (its
		// graceful-shutdown delay, 1 s): stop reading at it.
		return !c.done
	})
	res := c.result()
	if err != nil {
		return res, err
	}
	if !c.done {
		if cerr := ctx.Err(); cerr != nil {
			return res, transportError(ctx, "POST /command", cerr, true)
		}
		return res, fmt.Errorf("POST /command (command %s): %w", res.ID, ErrIncomplete)
	}
	return res, nil
}

// Start runs a background command and returns its id (its stream ends
// after init).
func (e *Execd) Start(ctx context.Context, cmd Command) (string, error) {
	cmd.Background = true
	id := ""
	err := e.stream(ctx, cmd, func(ev Event) bool {
		if ev.Type == EventInit {
			id = ev.Text
			return false
		}
		return true
	})
	if err != nil {
		return id, err
	}
	if id == "" {
		return "", fmt.Errorf("POST /command (background): %w: no init event named the command", ErrIncomplete)
	}
	e.mu.Lock()
	if e.started == nil {
		e.started = map[string]time.Time{}
	}
	for k, at := range e.started {
		if time.Since(at) > StartGrace {
			delete(e.started, k)
		}
	}
	e.started[id] = time.Now()
	e.mu.Unlock()
	return id, nil
}

// Status reads a command's status; an id execd does not know (it forgets
// them when it restarts) is sandbox.ErrNotFound. A 404 for a command this
// client started less than StartGrace ago is asked again (execd answers
// init before it registers a background command).
func (e *Execd) Status(ctx context.Context, id string) (CommandStatus, error) {
	for {
		st, err := e.status(ctx, id)
		if !errors.Is(err, sandbox.ErrNotFound) || !e.justStarted(id) {
			return st, err
		}
		if serr := sleep(ctx, 20*time.Millisecond); serr != nil {
			return st, err
		}
	}
}

func (e *Execd) justStarted(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	at, ok := e.started[id]
	return ok && time.Since(at) < StartGrace
}

func (e *Execd) status(ctx context.Context, id string) (CommandStatus, error) {
	what := "GET /command/status/" + id
	req, err := e.request(ctx, http.MethodGet, "/command/status/"+url.PathEscape(id), nil)
	if err != nil {
		return CommandStatus{}, err
	}
	resp, err := e.do(ctx, req, what, sandbox.ErrNotFound, http.StatusOK)
	if err != nil {
		return CommandStatus{}, err
	}
	defer resp.Body.Close()
	var st CommandStatus
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return CommandStatus{}, transportError(ctx, what, err, true)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return CommandStatus{}, fmt.Errorf("%s: the reply is not the JSON expected: %v (%.200q)", what, err, data)
	}
	return st, nil
}

// Logs reads a background command's output (stdout and stderr merged)
// from cursor (0: from the start) and returns it with the next cursor. An
// id execd does not know is sandbox.ErrNotFound (execd answers 400 or 404).
func (e *Execd) Logs(ctx context.Context, id string, cursor int64) ([]byte, int64, error) {
	what := "GET /command/" + id + "/logs"
	p := "/command/" + url.PathEscape(id) + "/logs"
	if cursor > 0 {
		p += "?cursor=" + strconv.FormatInt(cursor, 10)
	}
	req, err := e.request(ctx, http.MethodGet, p, nil)
	if err != nil {
		return nil, cursor, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := e.do(ctx, req, what, sandbox.ErrNotFound, http.StatusOK)
	if err != nil {
		var se *StatusError
		if errors.As(err, &se) && se.Status == http.StatusBadRequest {
			se.class = sandbox.ErrNotFound
		}
		return nil, cursor, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, cursor, transportError(ctx, what, err, true)
	}
	next := cursor
	if h := resp.Header.Get(TailCursorHeader); h != "" {
		if n, err := strconv.ParseInt(h, 10, 64); err == nil {
			next = n
		}
	}
	return data, next, nil
}

// Interrupt ends a command: execd sends SIGTERM to its process group and,
// inside the request (so it takes about 3 s), SIGKILL. A command that is
// not running any more is not an error: execd answers 500 "no such
// session" for a finished id and an unknown one alike (a 404 is
// sandbox.ErrNotFound); for a command this client started less than
// StartGrace ago, that answer is taken for execd not having registered it
// yet, and the interrupt is sent again.
func (e *Execd) Interrupt(ctx context.Context, id string) error {
	for {
		err := e.interrupt(ctx, id)
		var se *StatusError
		if !errors.As(err, &se) || se.Status != http.StatusInternalServerError || !strings.Contains(se.Message, "no such session") {
			return err
		}
		// Not registered yet, or already finished.
		if !e.justStarted(id) {
			return nil
		}
		if serr := sleep(ctx, 20*time.Millisecond); serr != nil {
			return err
		}
	}
}

func (e *Execd) interrupt(ctx context.Context, id string) error {
	what := "DELETE /command?id=" + id
	req, err := e.request(ctx, http.MethodDelete, "/command?id="+url.QueryEscape(id), nil)
	if err != nil {
		return err
	}
	resp, err := e.do(ctx, req, what, sandbox.ErrNotFound, http.StatusOK, http.StatusNoContent)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Wait polls a background command's status every poll until it is no
// longer running. execd may report a finished command as running for a
// while (up to about 30 s); Wait simply polls on. An id execd forgot is
// sandbox.ErrNotFound.
func (e *Execd) Wait(ctx context.Context, id string, poll time.Duration) (CommandStatus, error) {
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	for {
		st, err := e.Status(ctx, id)
		if err != nil || !st.Running {
			return st, err
		}
		if err := sleep(ctx, poll); err != nil {
			return st, err
		}
	}
}

// Upload writes data to path with meta's mode (and owner, group), as
// multipart/form-data: the metadata part first, sent as a file part (execd
// reads it only that way), then the file part. The body is streamed from
// data, never copied (a binary uploaded to many sandboxes at once is held
// once), and can be sent again (GetBody) if a redirect or a retry of the
// transport asks.
func (e *Execd) Upload(ctx context.Context, meta FileMetadata, data []byte) error {
	what := "POST /files/upload " + meta.Path
	mj, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	var head bytes.Buffer
	mw := multipart.NewWriter(&head)
	h := make(textproto.MIMEHeader)
	h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
	h.Set("Content-Type", "application/json")
	pw, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	pw.Write(mj)
	h = make(textproto.MIMEHeader)
	h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, path.Base(meta.Path)))
	h.Set("Content-Type", "application/octet-stream")
	if _, err = mw.CreatePart(h); err != nil {
		return err
	}
	// The writer's closing boundary, written after the data.
	tail := "\r\n--" + mw.Boundary() + "--\r\n"
	body := func() io.Reader {
		return io.MultiReader(bytes.NewReader(head.Bytes()), bytes.NewReader(data), strings.NewReader(tail))
	}
	req, err := e.request(ctx, http.MethodPost, "/files/upload", body())
	if err != nil {
		return err
	}
	req.ContentLength = int64(head.Len() + len(data) + len(tail))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body()), nil }
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := e.do(ctx, req, what, nil, http.StatusOK, http.StatusCreated, http.StatusNoContent)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return nil
}

// Download reads the file at path; a missing file is sandbox.ErrNotFound.
func (e *Execd) Download(ctx context.Context, p string) ([]byte, error) {
	return e.download(ctx, p, "")
}

// DownloadRange reads n bytes of the file at path from offset (HTTP
// Range); n <= 0 reads to the end.
func (e *Execd) DownloadRange(ctx context.Context, p string, offset, n int64) ([]byte, error) {
	r := fmt.Sprintf("bytes=%d-", offset)
	if n > 0 {
		r = fmt.Sprintf("bytes=%d-%d", offset, offset+n-1)
	}
	return e.download(ctx, p, r)
}

func (e *Execd) download(ctx context.Context, p, rng string) ([]byte, error) {
	what := "GET /files/download " + p
	req, err := e.request(ctx, http.MethodGet, "/files/download?path="+url.QueryEscape(p), nil)
	if err != nil {
		return nil, err
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := e.do(ctx, req, what, sandbox.ErrNotFound, http.StatusOK, http.StatusPartialContent)
	if err != nil {
		var se *StatusError
		if errors.As(err, &se) && se.Status == http.StatusRequestedRangeNotSatisfiable {
			return nil, nil // nothing at or after the offset
		}
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, transportError(ctx, what, err, true)
	}
	if rng != "" && resp.StatusCode == http.StatusOK {
		// The server ignored the range: cut it here.
		var off, end int64 = 0, -1
		fmt.Sscanf(rng, "bytes=%d-%d", &off, &end)
		if off >= int64(len(data)) {
			return nil, nil
		}
		if end >= 0 && end+1 < int64(len(data)) {
			data = data[:end+1]
		}
		data = data[off:]
	}
	return data, nil
}
