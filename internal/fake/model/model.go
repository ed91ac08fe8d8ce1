// Package model is the fake model: a scripted model server on the loopback interface,
// for end-to-end tests that run a real harness with no network and no real
// model. It speaks three wires: OpenAI chat completions (OpenCode, Pi), the
// OpenAI Responses API (Codex CLI) and the Anthropic Messages API (Claude
// Code).
//
// Every request, whatever its API, is parsed into one [Request] (its
// conversation normalised into the same [Message] shape, so that a test
// counts model calls per distinct history with [Request.HistoryKey] and sees
// each user turn's text parts byte for byte) and recorded; one script (a
// plain function of the request) decides the [Reply]: a text answer, one
// tool call, or both. Replies stream as server-sent events when the client
// asks for a stream, and are one JSON object otherwise. Tests can hold
// replies ([Server.Hold]) to freeze the harness mid-turn and release them
// later, delay them ([Reply.Delay]) and slow their streams ([Reply.Pace]).
//
// Routes:
//
//	POST /v1/chat/completions
//	POST /ng-rollout/{rollout}/v1/chat/completions
//	POST /v1/responses
//	POST /ng-rollout/{rollout}/v1/responses
//	POST /v1/messages                        (any query, e.g. ?beta=true)
//	POST /ng-rollout/{rollout}/v1/messages
//	GET  /v1/models
//	GET  /ng-rollout/{rollout}/v1/models
//	GET  /ng-control/v1/checkpoint/status    (only with Options.Checkpoint:
//	POST /ng-control/v1/checkpoint/{op}       NeMo Gym's control routes)
//
// The /ng-rollout/<id>[-a<attempt>] prefix is how the rollout framework tells
// the model server which rollout a request belongs to; it is parsed into
// [Request.Rollout] and [Request.Attempt]. No model route checks a key: any
// Authorization or x-api-key header is accepted (and recorded).
//
// With [Options.Checkpoint] the server is also NeMo Gym's policy model
// participant (kind "model", participant.go): its checkpoint control
// routes need the bearer token, and the model routes go through Gym's
// admission gate. Without it the control routes answer 404, which Gym's
// coordinator reads as "not a participant".
//
// What each wire follows (and was run against, see the tests):
//
//   - Chat completions: OpenAI's chunk stream (data lines only, [DONE] at
//     the end, usage chunk if stream_options.include_usage), as OpenCode
//     1.17.11's @ai-sdk/openai-compatible reads it, and Pi 0.73.1's
//     openai-completions provider (the OpenAI JS SDK 6.26.0: a system
//     message first, user content as text parts, an assistant's
//     "content": null beside its tool_calls, tool results as role "tool").
//   - Responses, as Codex CLI 0.171.0 reads it (openai/codex
//     codex-rs/codex-api/src/sse/responses.rs, process_sse): named events
//     whose data carries type and sequence_number: response.created,
//     response.in_progress, response.output_item.added / .done around each
//     output item (a "message" with one output_text part, streamed as
//     response.output_text.delta; a "function_call" with name, call_id and
//     arguments, a JSON string, streamed as
//     response.function_call_arguments.delta), then response.completed with
//     response.id, the output and usage (input, output, total tokens and
//     their details); Codex takes the turn as done at the end of the stream
//     after response.completed. Input items: messages (roles developer,
//     user, assistant; input_text / output_text parts), function_call and
//     function_call_output (output a string or text parts), and their
//     custom_tool_call forms; "instructions", if sent, is a system message.
//   - Messages, as Claude Code 2.1.332 reads it (Anthropic's streaming
//     docs, docs.claude.com/en/docs/build-with-claude/streaming): named
//     events message_start (usage.input_tokens), ping, content_block_start
//     / content_block_delta / content_block_stop per block (text with
//     text_delta; tool_use with input {} then input_json_delta pieces of
//     partial_json), message_delta (stop_reason tool_use or end_turn,
//     usage.output_tokens), message_stop. Requests: "system" as a string or
//     text blocks; messages of role user, assistant, or system (Claude Code
//     sends one after the first user message), content a string or blocks:
//     text, tool_use, tool_result (is_error, content a string or text
//     blocks). Errors are Anthropic-shaped ({"type":"error","error":...}).
package model

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ngharness/ngharness/pkg/gym"
)

// DefaultModel is the model id GET /v1/models lists when Options.Model is
// empty, and the model a reply names when its request named none.
const DefaultModel = "fake-model"

// maxBody bounds a request body.
const maxBody = 64 << 20

// Options configures a Server.
type Options struct {
	// Script decides each reply from the request (default:
	// DefaultScript("echo fakemodel")). It is called once per request, after
	// any hold ends, possibly from several goroutines at once.
	Script func(r Request) Reply
	// Logf, if set, receives one line per request and per notable event
	// (a client gone while held, a bad request, an unknown route). It is
	// never called after Close returns.
	Logf func(format string, args ...any)
	// Model is the model id GET /v1/models lists (default DefaultModel).
	Model string
	// Holdable, if set, picks the requests Hold applies to: a request it
	// rejects is answered at once and does not count toward Hold's n
	// (default: every request is holdable). It lets a test hold OpenCode's
	// main turn without catching the title request sent beside it.
	Holdable func(r Request) bool
	// Addr is the address to listen on (default 127.0.0.1:0, a free port).
	Addr string
	// Checkpoint, if set, makes the server NeMo Gym's policy model
	// participant (kind "model"); nil leaves it out of checkpoints.
	Checkpoint *Checkpoint
}

// Server is the fake model server. It is safe for concurrent use.
type Server struct {
	opt    Options
	script func(Request) Reply

	seq atomic.Int64 // ids of completions and tool calls

	mu       sync.Mutex
	reqs     []Request
	arrived  chan struct{} // closed and replaced at each arrival
	holdLeft int           // how many more holdable requests to hold
	held     int           // handlers waiting on release now
	release  chan struct{} // closed and replaced by Release
	started  bool
	closed   bool
	done     chan struct{} // closed by Close
	inflight sync.WaitGroup
	ln       net.Listener
	srv      *http.Server
	url      string
	policy   *policy      // the model participant, with Options.Checkpoint
	control  http.Handler // its control routes

	logMu sync.RWMutex
	quiet bool // set once Close has waited for every handler

	closeOnce sync.Once
}

// New returns a server configured by opt; Start makes it listen.
func New(opt Options) *Server {
	s := &Server{
		opt:     opt,
		script:  opt.Script,
		arrived: make(chan struct{}),
		release: make(chan struct{}),
		done:    make(chan struct{}),
	}
	if s.script == nil {
		s.script = DefaultScript("echo fakemodel")
	}
	if s.opt.Model == "" {
		s.opt.Model = DefaultModel
	}
	return s
}

// Start listens on Options.Addr (default 127.0.0.1 at a free port) and
// serves in the background; with Options.Checkpoint it first sets up the
// model participant. It fails if the server was already started or closed,
// or the checkpoint settings are not usable.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("fakemodel: start after close")
	}
	if s.started {
		return errors.New("fakemodel: already started")
	}
	if ck := s.opt.Checkpoint; ck != nil {
		if err := s.takePart(*ck); err != nil {
			return err
		}
	}
	addr := s.opt.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("fakemodel: listen: %w", err)
	}
	s.started = true
	s.ln = ln
	s.url = "http://" + ln.Addr().String()
	s.srv = &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(logWriter{s}, "", 0),
	}
	go s.srv.Serve(ln)
	return nil
}

// URL is the server's base address, http://127.0.0.1:PORT ("" before
// Start). Clients that want the OpenAI API root use URL()+"/v1".
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// Close stops the server: it stops listening, wakes every held request
// (whose client gets no reply), closes every connection and returns once
// every handler has returned. It may be called more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.done)
		srv := s.srv
		s.mu.Unlock()
		if srv != nil {
			srv.Close()
		}
		s.inflight.Wait()
		s.logMu.Lock()
		s.quiet = true
		s.logMu.Unlock()
	})
}

// Requests returns every model request so far (of every API), in arrival
// order. Requests that could not be parsed are answered 400 and are not recorded.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Hold makes the next n (holdable, see Options.Holdable) requests wait: each
// is recorded and logged on arrival, then its handler blocks until Release,
// Close, or its client going away. A second Hold replaces the count still
// left; Hold(0) stops holding new requests without releasing held ones.
func (s *Server) Hold(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdLeft = max(n, 0)
}

// Held is how many requests are being held now.
func (s *Server) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// Release delivers every held reply, and stops holding new requests until
// Hold is called again. Held is zero when it returns.
func (s *Server) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdLeft = 0
	s.held = 0
	close(s.release)
	s.release = make(chan struct{})
}

// WaitRequests blocks until n requests have arrived (held ones count), or
// ctx ends, or the server closes.
func (s *Server) WaitRequests(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		got, ch := len(s.reqs), s.arrived
		s.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-s.done:
			return fmt.Errorf("fakemodel: server closed after %d of %d requests", got, n)
		case <-ctx.Done():
			return fmt.Errorf("fakemodel: %d of %d requests arrived: %w", got, n, context.Cause(ctx))
		}
	}
}

// takePart makes the server the model participant of ck: pkg/gym's
// control plane over the policy gate, and its routes.
func (s *Server) takePart(ck Checkpoint) error {
	if ck.Instance == "" {
		ck.Instance = DefaultInstance
	}
	if ck.LeaseGrace == 0 {
		ck.LeaseGrace = DefaultLeaseGrace
	}
	p := newPolicy()
	ctl, err := gym.NewControl(p, gym.Config{Instance: ck.Instance, LeaseGrace: ck.LeaseGrace, Logf: s.logf})
	if err != nil {
		return fmt.Errorf("fakemodel: cannot take part in checkpoints: %w", err)
	}
	p.ctl = ctl
	h, err := gym.NewHandler(ctl, ck.Token)
	if err != nil {
		return fmt.Errorf("fakemodel: cannot take part in checkpoints: %w", err)
	}
	s.policy, s.control = p, h
	return nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	for _, a := range []*api{chatAPI, responsesAPI, messagesAPI} {
		mux.HandleFunc("POST "+a.path, s.gated(s.handle(a)))
		mux.HandleFunc("POST /ng-rollout/{rollout}"+a.path, s.gated(s.handle(a)))
	}
	if s.control != nil {
		mux.Handle(gym.RoutePrefix+"/", s.control)
	}
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /ng-rollout/{rollout}/v1/models", s.handleModels)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.logf("fakemodel: no route for %s %s", r.Method, r.URL.Path)
		writeError(w, http.StatusNotFound, "not_found_error", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return s.track(mux)
}

// track counts handlers in flight, so that Close can wait for them, and
// turns requests away once the server is closing.
func (s *Server) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			writeError(w, http.StatusServiceUnavailable, "server_error", "fakemodel: closed")
			return
		}
		s.inflight.Add(1)
		s.mu.Unlock()
		defer s.inflight.Done()
		next.ServeHTTP(w, r)
	})
}

// handle is the one handler of every model API: it parses the request into
// a Request with a's decoder, records and logs it, holds it if a hold is
// on, asks the script for the reply, and writes the reply in a's wire
// format, streamed if the request asked for a stream.
func (s *Server) handle(a *api) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, opts, err := parseRequest(r, a)
		if err != nil {
			s.logf("fakemodel: %s %s: bad request: %v", r.Method, r.URL.Path, err)
			a.fail(w, http.StatusBadRequest, err.Error())
			return
		}
		holdable := s.opt.Holdable == nil || s.opt.Holdable(req)

		s.mu.Lock()
		s.reqs = append(s.reqs, req)
		num := len(s.reqs)
		close(s.arrived)
		s.arrived = make(chan struct{})
		var rel chan struct{}
		if holdable && s.holdLeft > 0 {
			s.holdLeft--
			s.held++
			rel = s.release
		}
		s.mu.Unlock()

		s.logf("fakemodel: #%d %s", num, req.summary())
		if rel != nil {
			s.logf("fakemodel: #%d held", num)
			select {
			case <-rel:
				s.logf("fakemodel: #%d released", num)
			case <-r.Context().Done():
				s.unhold(rel)
				s.logf("fakemodel: #%d: client went away while held (%v)", num, context.Cause(r.Context()))
				return
			case <-s.done:
				s.unhold(rel)
				panic(http.ErrAbortHandler) // no reply: the connection is cut
			}
		}

		reply := s.script(req)
		if reply.Delay > 0 {
			if err := s.wait(r, reply.Delay); err != nil {
				s.logf("fakemodel: #%d: %v during the reply's delay", num, err)
				return
			}
		}
		id := s.seq.Add(1)
		if reply.ToolCall != nil && reply.ToolCall.ID == "" {
			tc := *reply.ToolCall
			tc.ID = fmt.Sprintf("%sfake%d", a.callPrefix, id)
			reply.ToolCall = &tc
		}
		s.logf("fakemodel: #%d reply %s", num, reply.summary())
		model := req.Model
		if model == "" {
			model = s.opt.Model
		}
		c := completion{id: id, model: model, created: time.Now().Unix(), reply: reply, promptTokens: len(req.Body)/4 + 1}
		if !req.Stream {
			a.writeJSON(c, w)
			return
		}
		es := s.startEvents(w, r, reply.Pace)
		if err := a.writeStream(c, es, opts); err != nil {
			s.logf("fakemodel: #%d: stream: %v", num, err)
		}
	}
}

// errClientGone is a wait or a stream cut short by the client going away.
var errClientGone = errors.New("the client went away")

// wait waits d, or until r's client goes away (errClientGone); if the
// server closes first, it cuts the connection (the handler ends at once).
func (s *Server) wait(r *http.Request, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.Context().Done():
		return errClientGone
	case <-s.done:
		panic(http.ErrAbortHandler)
	}
}

// unhold ends one hold that Release has not ended already.
func (s *Server) unhold(rel chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-rel: // Release already counted it
	default:
		s.held--
	}
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	s.logf("fakemodel: GET %s", r.URL.Path)
	writeJSONBody(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": s.opt.Model, "object": "model", "created": 0, "owned_by": "fakemodel",
		}},
	})
}

func (s *Server) logf(format string, args ...any) {
	if s.opt.Logf == nil {
		return
	}
	s.logMu.RLock()
	defer s.logMu.RUnlock()
	if !s.quiet {
		s.opt.Logf(format, args...)
	}
}

// logWriter sends net/http's own error log through Logf.
type logWriter struct{ s *Server }

func (l logWriter) Write(p []byte) (int, error) {
	l.s.logf("fakemodel: http: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
