package harness

// Helpers for adapters of command-line harnesses (OpenCode, Codex, Claude
// Code, Pi): the checks of their common options, the state folder and its
// name in the state, the rollout's segment of the model URL, the task (as
// one argument), the newest session file of a state folder, the session's
// JSON lines kept in a response and read back for Gym, a tool call's
// arguments as Gym's JSON text. They hold no
// harness's names; each adapter passes its own (the name that starts its
// errors and its config section).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/proto"
)

// CheckModelURL checks an adapter's model_url option: set, and an
// http(s) URL with a host. The errors name the adapter and its config key.
func CheckModelURL(adapter, modelURL string) error {
	if modelURL == "" {
		return fmt.Errorf("%s: the model server (%s.model_url) is required", adapter, adapter)
	}
	if u, err := url.Parse(modelURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s: model_url %q is not an http(s) URL", adapter, modelURL)
	}
	return nil
}

// CheckEnvNames checks the names of an adapter's env option: each can be
// an environment variable (not empty, no '=' or NUL).
func CheckEnvNames(adapter string, env map[string]string) error {
	for k := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("%s: env name %q is not a variable name", adapter, k)
		}
	}
	return nil
}

// ParseTimeout reads an adapter's timeout option, a Go duration ("" is
// none: 0).
func ParseTimeout(adapter, timeout string) (time.Duration, error) {
	if timeout == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(timeout)
	if err != nil {
		return 0, fmt.Errorf("%s: timeout %q: %v", adapter, timeout, err)
	}
	return d, nil
}

// StateHome reads the state of an adapter that keeps a rollout attempt's
// files in one folder, {"home": FOLDER}: the folder, which must be
// absolute.
func StateHome(adapter string, raw json.RawMessage) (string, error) {
	var s struct {
		Home string `json:"home"`
	}
	if err := json.Unmarshal(raw, &s); err != nil || s.Home == "" || !path.IsAbs(s.Home) {
		return s.Home, fmt.Errorf("%s: the state %s names no absolute folder", adapter, raw)
	}
	return s.Home, nil
}

// StateDir is a new folder for one attempt's harness state (its HOME, its
// session files) under the sandbox's ngharness root, so the sandbox's
// snapshot carries it: <root>/state/<adapter>/<rollout>-a<attempt>-<ns>,
// the rollout id with every character outside [A-Za-z0-9_-] made '_'. The
// nanosecond suffix keeps a relaunch that starts over apart from the
// folder it left.
func StateDir(sb LentSandbox, adapter, rollout string, attempt int) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, rollout)
	return path.Join(sb.Root(), "state", adapter, fmt.Sprintf("%s-a%d-%d", clean, attempt, time.Now().UnixNano()))
}

// TaskText reads a harness's task from a run body: "task", else the last
// user input of responses_create_params (a string, or a message whose
// content is a string or text parts, joined by newlines). Every adapter
// that gives its harness one prompt reads it this way.
func TaskText(body json.RawMessage) (string, error) {
	var b struct {
		Task   *string `json:"task"`
		Params struct {
			Input json.RawMessage `json:"input"`
		} `json:"responses_create_params"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return "", fmt.Errorf("read the task: %w", err)
	}
	if b.Task != nil && *b.Task != "" {
		return *b.Task, nil
	}
	var s string
	if json.Unmarshal(b.Params.Input, &s) == nil && s != "" {
		return s, nil
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(b.Params.Input, &msgs) == nil {
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].Role != "user" {
				continue
			}
			if json.Unmarshal(msgs[i].Content, &s) == nil && s != "" {
				return s, nil
			}
			var parts []struct {
				Text string `json:"text"`
			}
			if json.Unmarshal(msgs[i].Content, &parts) == nil {
				var t []string
				for _, p := range parts {
					t = append(t, p.Text)
				}
				if j := strings.Join(t, "\n"); j != "" {
					return j, nil
				}
			}
		}
	}
	return "", errors.New("the run body has no task (a \"task\" string or responses_create_params.input)")
}

// RolloutSegment is the path segment that attributes model calls to a
// rollout attempt: <id>-a<attempt>, escaped as one path segment, so that
// no character of the id ('/', '?', '#', '%', a space) changes the URL's
// shape, and the model server reads the exact id back.
func RolloutSegment(rollout string, attempt int) string {
	return url.PathEscape(fmt.Sprintf("%s-a%d", rollout, attempt))
}

// MaxArg is Linux's bound on one argument string (MAX_ARG_STRLEN, 32
// pages), its terminating NUL included.
const MaxArg = 32 * 4096

// TaskArg reads the task of a run body (TaskText) and checks that it can
// be one command-line argument: no NUL byte, shorter than MaxArg.
func TaskArg(body json.RawMessage) (string, error) {
	task, err := TaskText(body)
	if err != nil {
		return "", err
	}
	if strings.IndexByte(task, 0) >= 0 {
		return "", errors.New("the task holds a NUL byte, which no command-line argument can carry")
	}
	if len(task) >= MaxArg {
		return "", fmt.Errorf("the task is %d bytes; Linux passes at most %d bytes in one argument", len(task), MaxArg-1)
	}
	return task, nil
}

// newestScript prints the newest regular file matching the glob $2 below
// the folder $1, its path on the first line and its content after;
// nothing when none matches. The folder arrives quoted; the glob is the
// adapter's constant, expanded on purpose. Nothing is shell text from a
// run.
const newestScript = `last=
for f in "$1"/$2; do
  [ -f "$f" ] || continue
  if [ -z "$last" ] || [ "$f" -nt "$last" ]; then last=$f; fi
done
[ -n "$last" ] || exit 0
printf '%s\n' "$last" && cat -- "$last"`

// ReadNewestFile reads, inside the sandbox, the newest file (by modification
// time) below dir matching glob (a shell pattern relative to dir, such as
// "projects/*/*.jsonl"): its path and content, or "" and nil when none
// matches.
func ReadNewestFile(ctx context.Context, sb LentSandbox, dir, glob string) (string, []byte, error) {
	res, err := sb.Exec(ctx, sandbox.ExecRequest{
		Argv: []string{"/bin/sh", "-c", newestScript, "sh", dir, glob}, Timeout: 2 * time.Minute})
	if err != nil {
		return "", nil, fmt.Errorf("read %s/%s: %w", dir, glob, err)
	}
	if res.ExitCode != 0 {
		return "", nil, fmt.Errorf("read %s/%s: exit code %d: %.300s", dir, glob, res.ExitCode, res.Stderr)
	}
	if len(res.Stdout) == 0 {
		return "", nil, nil
	}
	first, rest, _ := strings.Cut(string(res.Stdout), "\n")
	return first, []byte(rest), nil
}

// ReadSandboxFile reads one file inside the sandbox; a file that is not
// there reads as ok false with no error.
func ReadSandboxFile(ctx context.Context, sb LentSandbox, file string) (data []byte, ok bool, err error) {
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "--", file}, Timeout: time.Minute})
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", file, err)
	}
	if res.ExitCode != 0 {
		return nil, false, nil
	}
	return res.Stdout, true, nil
}

// LaunchStdout is where a launch's stdout is kept: the file
// proto.StdoutFile in its folder (LaunchContext.LaunchDir), the
// harness's fd 1 itself (ngsup opens it O_APPEND for the harness, and
// the tag-only launcher redirects to it), so what the harness wrote is
// there at once, and the sandbox's snapshot carries it into a fork.
func LaunchStdout(launchDir string) string { return path.Join(launchDir, proto.StdoutFile) }

// ReadTail reads, inside the sandbox, the last max bytes of file; when
// the file was longer, its first line, cut by the bound, is left out. A
// file that is not there reads as ok false with no error.
func ReadTail(ctx context.Context, sb LentSandbox, file string, max int) (data []byte, ok bool, err error) {
	// One byte more than the bound tells a file longer than it, and
	// whether the bound fell on a line's end.
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"tail", "-c", strconv.Itoa(max + 1), "--", file}, Timeout: 2 * time.Minute})
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", file, err)
	}
	if res.ExitCode != 0 {
		return nil, false, nil
	}
	data = res.Stdout
	if len(data) > max {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return nil, true, nil // one line, longer than the bound
		}
		data = data[i+1:]
	}
	return data, true, nil
}

// ReadSavedSession reads what a CLI adapter's resume decision weighs: the
// newest session file below dir matching glob (ReadNewestFile), read by
// parse, and the task saved in taskFile. When there is none to weigh
// (none read, none there, parse refuses it, the task unreadable), why
// says so as a fresh start's reason, naming the folder as folder (such as
// "CODEX_HOME"). The error is only a cancelled ctx's.
func ReadSavedSession[S any](ctx context.Context, sb LentSandbox, dir, glob, taskFile, folder string, parse func([]byte) (S, error)) (s S, task, why string, err error) {
	file, data, err := ReadNewestFile(ctx, sb, dir, glob)
	switch {
	case err != nil && ctx.Err() != nil:
		return s, "", "", err
	case err != nil:
		return s, "", fmt.Sprintf("the saved session could not be read (%v)", err), nil
	case file == "":
		return s, "", "the saved " + folder + " holds no session", nil
	}
	if s, err = parse(data); err != nil {
		return s, "", fmt.Sprintf("the saved session %s could not be read (%v)", path.Base(file), err), nil
	}
	t, _, err := ReadSandboxFile(ctx, sb, taskFile)
	switch {
	case err != nil && ctx.Err() != nil:
		return s, "", "", err
	case err != nil:
		return s, "", fmt.Sprintf("the task beside the saved session could not be read (%v)", err), nil
	}
	return s, string(t), "", nil
}

// JSONLinesArray turns JSON lines into one JSON array of them, leaving
// out the lines that are not JSON (a last line cut short by a kill), so a
// session file can be kept whole inside a JSON response.
func JSONLinesArray(data []byte) json.RawMessage {
	var b strings.Builder
	b.WriteByte('[')
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || !json.Valid([]byte(l)) {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l)
		n++
	}
	b.WriteByte(']')
	return json.RawMessage(b.String())
}

// ArrayJSONLines is JSONLinesArray undone: a JSON array's elements, one a
// line. Null or empty reads as no data and no error.
func ArrayJSONLines(raw json.RawMessage) ([]byte, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var lines []json.RawMessage
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("the stored session is not a list of lines: %w", err)
	}
	var data []byte
	for _, l := range lines {
		data = append(append(data, l...), '\n')
	}
	return data, nil
}

// StoredRun is what the Response of an adapter that keeps its session as
// JSON lines stores, as its GymResult reads it back.
type StoredRun struct {
	ExitCode int `json:"exit_code"`
	// Session is the session's lines (JSONLinesArray), null when none was
	// read.
	Session     json.RawMessage `json:"session"`
	SessionPath string          `json:"session_path"`
	Stdout      string          `json:"stdout_tail"`
	Stderr      string          `json:"stderr_tail"`
}

// ReadStoredRun reads an adapter's stored response back: the run, and
// its session's lines (ArrayJSONLines; nil when none was stored).
func ReadStoredRun(adapter string, response json.RawMessage) (StoredRun, []byte, error) {
	var r StoredRun
	if err := json.Unmarshal(response, &r); err != nil {
		return r, nil, fmt.Errorf("%s: the stored response is not the adapter's: %w", adapter, err)
	}
	data, err := ArrayJSONLines(r.Session)
	if err != nil {
		return r, nil, fmt.Errorf("%s: %w", adapter, err)
	}
	return r, data, nil
}

// LinesGymResult is the GymResult (GymResulter) of an adapter whose
// Response stores a StoredRun: `response` is build's NeMoGymResponse of
// the stored session read by parse (the zero S, found false, when none
// was stored), the request side from the body's responses_create_params
// and the model named model; the fields beside it are fields' JSON
// fields. Errors name the adapter.
func LinesGymResult[S any](adapter string, response, body json.RawMessage, model string,
	parse func([]byte) (S, error), build func(S, gym.ResponseOptions) gym.Response,
	fields func(r StoredRun, found bool) any) (json.RawMessage, map[string]json.RawMessage, error) {
	r, data, err := ReadStoredRun(adapter, response)
	if err != nil {
		return nil, nil, err
	}
	opt, err := gym.ResponseOptionsFromBody(body, model)
	if err != nil {
		return nil, nil, err
	}
	var s S
	if data != nil {
		if s, err = parse(data); err != nil {
			return nil, nil, fmt.Errorf("%s: the stored session: %w", adapter, err)
		}
	}
	resp, err := json.Marshal(build(s, opt))
	if err != nil {
		return nil, nil, err
	}
	f, err := JSONFields(fields(r, data != nil))
	return resp, f, err
}

// JSONFields splits a value into its JSON object's fields (the fields an
// adapter's GymResult puts beside `response`).
func JSONFields(v any) (map[string]json.RawMessage, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out map[string]json.RawMessage
	return out, json.Unmarshal(data, &out)
}

// ArgumentsJSON is a tool call's arguments (a harness's saved tool input)
// as the JSON text a NeMoGymResponse function_call carries: compact, and
// "{}" when there are none or they are not JSON.
func ArgumentsJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if len(bytes.TrimSpace(raw)) == 0 || json.Compact(&b, raw) != nil {
		return "{}"
	}
	return b.String()
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Continuable is the rule every adapter applies to a saved session before
// continuing it: its user turns (users, in order) start with the task (if
// task is set) and it holds at least one completed model response
// (responses). why says which, as a launch record's reason.
func Continuable(sessionID string, users []string, responses int, task string) (ok bool, why string) {
	switch {
	case len(users) == 0:
		return false, "the saved session has no user message"
	case task != "" && users[0] != task:
		return false, "the saved session does not start with the task"
	case responses == 0:
		return false, "the saved session holds no completed model response"
	}
	return true, fmt.Sprintf("session %s starts with the task and holds %d completed model response%s", sessionID, responses, Plural(responses))
}

// Plural is "s" unless n is 1.
func Plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
