// Package resume is the in-sandbox resume helper of the OpenCode adapter:
// it continues a saved OpenCode session without adding a user turn. It
// starts an authenticated loopback `opencode serve`, posts the session's
// last user message back with empty parts (OpenCode upserts it and runs the
// turn loop again, so the model sees the interrupted tool result), checks
// that the saved user turns are unchanged, and stops the server.
//
// It is a static Go program (cmd/ngresume), uploaded only when a relaunch
// needs it, so it needs no Python: task images whose python3 is 3.5 or 3.6
// relaunch like any other. OpenCode and the commands the model runs keep
// the task's own environment.
package resume

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Options says what to continue.
type Options struct {
	// OpenCode is the opencode binary.
	OpenCode string
	// SessionID is the session to continue ("": the most recently updated
	// top-level session).
	SessionID string
	// Directory overrides the session's own working folder.
	Directory string
	// ReadyTimeout bounds the server's start; TurnTimeout the continued
	// turn loop (0: none).
	ReadyTimeout, TurnTimeout time.Duration
	// Log receives progress lines.
	Log io.Writer
}

// Result is what a resume did, printed as one JSON line.
type Result struct {
	SessionID string `json:"session_id"`
	// ContinuedFrom is the user message whose turn was re-entered.
	ContinuedFrom string `json:"continued_from"`
	// UserMessages is how many user messages the session holds (unchanged).
	UserMessages int `json:"user_messages"`
	// NewAssistantMessages counts the assistant messages the turn added.
	NewAssistantMessages int `json:"new_assistant_messages"`
	// FinalText is the text of the last assistant message.
	FinalText string `json:"final_text"`
	// ElapsedMS is the whole resume's wall time.
	ElapsedMS int64 `json:"elapsed_ms"`
}

// Errors a caller can tell apart.
var (
	// ErrNoSession: the data folder holds no session to continue.
	ErrNoSession = errors.New("no saved session")
	// ErrUserTurnsChanged: after the resume the saved user turns differ
	// (one was added, removed or changed): the session must not be graded
	// as a continuation.
	ErrUserTurnsChanged = errors.New("the saved user turns changed")
	// ErrServer: opencode serve did not start or answer.
	ErrServer = errors.New("opencode serve failed")
)

// message is OpenCode's message with its parts (GET /session/{id}/message).
type message struct {
	Info struct {
		ID       string `json:"id"`
		Role     string `json:"role"`
		ParentID string `json:"parentID"`
		Finish   string `json:"finish"`
		Time     struct {
			Created   float64 `json:"created"`
			Completed float64 `json:"completed"`
		} `json:"time"`
	} `json:"info"`
	Parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"parts"`
}

func (m message) text() string {
	var b strings.Builder
	for _, p := range m.Parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

type session struct {
	ID        string `json:"id"`
	ParentID  string `json:"parentID"`
	Directory string `json:"directory"`
	Time      struct {
		Updated float64 `json:"updated"`
	} `json:"time"`
}

// server is a running `opencode serve`.
type server struct {
	cmd      *exec.Cmd
	base     string
	password string
	client   *http.Client
}

var listening = regexp.MustCompile(`listening on (http://[0-9.:]+)`)

// Run continues the session and returns what it did. The server is always
// stopped before it returns.
func Run(ctx context.Context, opt Options) (Result, error) {
	begin := time.Now()
	logf := func(format string, args ...any) {
		if opt.Log != nil {
			fmt.Fprintf(opt.Log, "ngresume: "+format+"\n", args...)
		}
	}
	if opt.ReadyTimeout <= 0 {
		opt.ReadyTimeout = 90 * time.Second
	}
	srv, err := start(ctx, opt, logf)
	if err != nil {
		return Result{}, err
	}
	defer srv.stop()
	sess, err := srv.pick(ctx, opt.SessionID)
	if err != nil {
		return Result{}, err
	}
	dir := sess.Directory
	if opt.Directory != "" {
		dir = opt.Directory
	}
	before, err := srv.messages(ctx, sess.ID, dir)
	if err != nil {
		return Result{}, err
	}
	var lastUser *message
	users := 0
	for i := range before {
		if before[i].Info.Role == "user" {
			lastUser = &before[i]
			users++
		}
	}
	if lastUser == nil {
		return Result{}, fmt.Errorf("%w: session %s has no user message", ErrNoSession, sess.ID)
	}
	logf("session %s: re-entering the turn of user message %s (%d messages saved)", sess.ID, lastUser.Info.ID, len(before))
	turnCtx := ctx
	if opt.TurnTimeout > 0 {
		var cancel context.CancelFunc
		turnCtx, cancel = context.WithTimeout(ctx, opt.TurnTimeout)
		defer cancel()
	}
	body, _ := json.Marshal(map[string]any{"messageID": lastUser.Info.ID, "parts": []any{}})
	if _, err := srv.do(turnCtx, http.MethodPost, "/session/"+url.PathEscape(sess.ID)+"/message", dir, body); err != nil {
		return Result{}, fmt.Errorf("continue session %s: %w", sess.ID, err)
	}
	after, err := srv.messages(ctx, sess.ID, dir)
	if err != nil {
		return Result{}, err
	}
	if err := sameUserTurns(before, after); err != nil {
		return Result{}, fmt.Errorf("session %s: %w", sess.ID, err)
	}
	res := Result{SessionID: sess.ID, ContinuedFrom: lastUser.Info.ID, UserMessages: users}
	seen := map[string]bool{}
	for _, m := range before {
		seen[m.Info.ID] = true
	}
	for _, m := range after {
		if m.Info.Role == "assistant" {
			if !seen[m.Info.ID] {
				res.NewAssistantMessages++
			}
			if t := m.text(); t != "" {
				res.FinalText = t
			}
		}
	}
	res.ElapsedMS = time.Since(begin).Milliseconds()
	logf("session %s: the turn ended with %d new assistant messages", sess.ID, res.NewAssistantMessages)
	return res, nil
}

// sameUserTurns checks that after holds exactly the user messages of
// before, same ids, same order, same text.
func sameUserTurns(before, after []message) error {
	pick := func(ms []message) []message {
		var out []message
		for _, m := range ms {
			if m.Info.Role == "user" {
				out = append(out, m)
			}
		}
		return out
	}
	b, a := pick(before), pick(after)
	if len(a) != len(b) {
		return fmt.Errorf("%w: %d user messages before, %d after", ErrUserTurnsChanged, len(b), len(a))
	}
	for i := range b {
		if a[i].Info.ID != b[i].Info.ID || a[i].text() != b[i].text() {
			return fmt.Errorf("%w: user message %d was %s %q, is %s %q", ErrUserTurnsChanged, i, b[i].Info.ID, b[i].text(), a[i].Info.ID, a[i].text())
		}
	}
	return nil
}

func start(ctx context.Context, opt Options, logf func(string, ...any)) (*server, error) {
	pw := make([]byte, 24)
	if _, err := rand.Read(pw); err != nil {
		return nil, err
	}
	s := &server{password: hex.EncodeToString(pw), client: &http.Client{}}
	cmd := exec.Command(opt.OpenCode, "serve", "--hostname", "127.0.0.1", "--port", "0")
	cmd.Env = append(withoutKey(os.Environ(), "OPENCODE_SERVER_PASSWORD"), "OPENCODE_SERVER_PASSWORD="+s.password)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = opt.Log
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start %s: %v", ErrServer, opt.OpenCode, err)
	}
	s.cmd = cmd
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	deadline := time.After(opt.ReadyTimeout)
	select {
	case s.base = <-found:
	case <-deadline:
		s.stop()
		return nil, fmt.Errorf("%w: no listening line within %s", ErrServer, opt.ReadyTimeout)
	case <-ctx.Done():
		s.stop()
		return nil, ctx.Err()
	}
	// A request sent just as the port opens can hang: poll health with a
	// short timeout until it answers.
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := s.do(hctx, http.MethodGet, "/global/health", "", nil)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-deadline:
			s.stop()
			return nil, fmt.Errorf("%w: not healthy within %s: %v", ErrServer, opt.ReadyTimeout, err)
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	logf("opencode serve ready at %s", s.base)
	return s, nil
}

func withoutKey(env []string, key string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, key+"=") })
}

// do sends one authenticated request and returns the body of a 2xx reply.
func (s *server) do(ctx context.Context, method, path, dir string, body []byte) ([]byte, error) {
	u := s.base + path
	if dir != "" {
		u += "?directory=" + url.QueryEscape(dir)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth("opencode", s.password)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s answered %d: %.300s", method, path, resp.StatusCode, data)
	}
	return data, nil
}

func (s *server) pick(ctx context.Context, id string) (session, error) {
	data, err := s.do(ctx, http.MethodGet, "/session", "", nil)
	if err != nil {
		return session{}, fmt.Errorf("%w: list sessions: %v", ErrServer, err)
	}
	var all []session
	if err := json.Unmarshal(data, &all); err != nil {
		return session{}, fmt.Errorf("%w: list sessions: %v", ErrServer, err)
	}
	var best *session
	for i := range all {
		s := &all[i]
		if id != "" {
			if s.ID == id {
				return *s, nil
			}
			continue
		}
		if s.ParentID == "" && (best == nil || s.Time.Updated > best.Time.Updated) {
			best = s
		}
	}
	if best == nil {
		if id != "" {
			return session{}, fmt.Errorf("%w: session %s is not in the data folder", ErrNoSession, id)
		}
		return session{}, fmt.Errorf("%w: the data folder holds no session", ErrNoSession)
	}
	return *best, nil
}

func (s *server) messages(ctx context.Context, id, dir string) ([]message, error) {
	data, err := s.do(ctx, http.MethodGet, "/session/"+url.PathEscape(id)+"/message", dir, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: read session %s: %v", ErrServer, id, err)
	}
	var ms []message
	if err := json.Unmarshal(data, &ms); err != nil {
		return nil, fmt.Errorf("%w: read session %s: %v", ErrServer, id, err)
	}
	return ms, nil
}

// stop ends the server's process group: SIGTERM, then SIGKILL after 5 s.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	pgid := s.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
	}
	s.cmd = nil
}
