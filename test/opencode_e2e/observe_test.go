package opencodee2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// mainTurns keeps the requests that offer tools (OpenCode's main turns; the
// title request offers none).
func mainTurns(reqs []fakemodel.Request) []fakemodel.Request {
	var out []fakemodel.Request
	for _, r := range reqs {
		if r.HasTools {
			out = append(out, r)
		}
	}
	return out
}

// signature is what makes two requests the same model call: whether they
// offer tools, and the conversation without the system prompt.
func signature(r fakemodel.Request) string {
	var msgs []fakemodel.Message
	for _, m := range r.Messages {
		if m.Role != "system" {
			msgs = append(msgs, m)
		}
	}
	data, _ := json.Marshal(struct {
		Tools bool
		Msgs  []fakemodel.Message
	}{r.HasTools, msgs})
	return string(data)
}

// checkNoRepeats fails the test if any request repeats an earlier one.
func checkNoRepeats(t *testing.T, reqs []fakemodel.Request) {
	t.Helper()
	seen := map[string]int{}
	for i, r := range reqs {
		s := signature(r)
		if j, ok := seen[s]; ok {
			t.Errorf("model request %d repeats request %d: %s", i+1, j+1, harnesstest.DescribeRequest(r))
		}
		seen[s] = i
	}
}

// checkOneToolRun checks the model requests of one completed single-tool
// turn of an attempt: exactly title, tool call, final (3 requests, 2 with
// tools), the main turn ending with the task as the user's message, the
// final ending with the result of the tool call the model made, and no
// request repeated. It returns a summary.
func checkOneToolRun(t *testing.T, reqs []fakemodel.Request, attempt int) string {
	t.Helper()
	checkNoRepeats(t, reqs)
	mains := mainTurns(reqs)
	if len(reqs) != 3 || len(mains) != 2 {
		for i, r := range reqs {
			t.Logf("model request %d: %s", i+1, harnesstest.DescribeRequest(r))
		}
		t.Fatalf("%d model requests, %d with tools; want 3 (title, tool call, final), 2 with tools", len(reqs), len(mains))
	}
	for _, r := range reqs {
		if r.Attempt != attempt {
			t.Errorf("request %s: attempt %d, want %d", r.Path, r.Attempt, attempt)
		}
	}
	if last := mains[0].LastMessage(); last.Role != "user" || last.Content != task {
		t.Errorf("the main turn ends with %s %q, want the user's task %q exactly", last.Role, last.Content, task)
	}
	final := mains[1]
	n := len(final.Messages)
	if n < 3 {
		t.Fatalf("the final request's history is %+v", final.Messages)
	}
	call, res := final.Messages[n-2], final.Messages[n-1]
	if res.Role != "tool" || call.Role != "assistant" || len(call.ToolCalls) != 1 || call.ToolCalls[0].ID != res.ToolCallID {
		t.Errorf("the final request ends with %+v then %+v, want the tool call and its result", call, res)
	}
	if strings.Contains(res.Content, "interrupted") {
		t.Errorf("the tool result says it was interrupted: %q", res.Content)
	}
	return fmt.Sprintf("%d model requests (title, tool call, final), %d with tools, none repeated", len(reqs), len(mains))
}

// session is an `opencode export`: the session and its messages.
type session struct {
	Info struct {
		ID        string `json:"id"`
		Directory string `json:"directory"`
		Title     string `json:"title"`
	} `json:"info"`
	Messages []struct {
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
			Type   string `json:"type"`
			Text   string `json:"text"`
			Tool   string `json:"tool"`
			CallID string `json:"callID"`
			State  struct {
				Status string `json:"status"`
				Output string `json:"output"`
			} `json:"state"`
		} `json:"parts"`
	} `json:"messages"`
}

// users lists the session's user messages as "id text".
func (s session) users() []string {
	var out []string
	for _, m := range s.Messages {
		if m.Info.Role != "user" {
			continue
		}
		var text strings.Builder
		for _, p := range m.Parts {
			if p.Type == "text" {
				text.WriteString(p.Text)
			}
		}
		out = append(out, m.Info.ID+" "+text.String())
	}
	return out
}

// describe is the session's messages in one line: role, finish,
// completed, and tool parts' states.
func (s session) describe() string {
	var parts []string
	for _, m := range s.Messages {
		d := m.Info.Role
		if m.Info.Role == "assistant" {
			d += fmt.Sprintf("(finish=%q completed=%t", m.Info.Finish, m.Info.Time.Completed > 0)
			for _, p := range m.Parts {
				if p.Type == "tool" {
					d += fmt.Sprintf(" %s:%s", p.Tool, p.State.Status)
				}
			}
			d += ")"
		}
		parts = append(parts, d)
	}
	return fmt.Sprintf("session %s %q: [%s]", s.Info.ID, s.Info.Title, strings.Join(parts, ", "))
}

// toolCallID is the call id of the session's only tool part ("" unless
// there is exactly one).
func (s session) toolCallID() string {
	var ids []string
	for _, m := range s.Messages {
		for _, p := range m.Parts {
			if p.Type == "tool" {
				ids = append(ids, p.CallID)
			}
		}
	}
	if len(ids) != 1 {
		return ""
	}
	return ids[0]
}

// completedAssistants counts the assistant messages with time.completed.
func (s session) completedAssistants() int {
	n := 0
	for _, m := range s.Messages {
		if m.Info.Role == "assistant" && m.Info.Time.Completed > 0 {
			n++
		}
	}
	return n
}

func parseSession(t *testing.T, raw []byte) session {
	t.Helper()
	if i := bytes.IndexByte(raw, '{'); i > 0 {
		raw = raw[i:]
	}
	var s session
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("the session export is not JSON: %v\n%.2000s", err, raw)
	}
	return s
}

// exportSaved exports the session saved in an OpenCode data folder of a
// snapshot or sandbox (host folder root), without touching it: the data
// folder is copied, and `opencode session list` and `opencode export` run
// on the host against the copy.
func (w *world) exportSaved(root string) session {
	w.T.Helper()
	datas, _ := filepath.Glob(filepath.Join(root, local.RootFolder, "state", "opencode", "*", "data"))
	if len(datas) != 1 {
		w.T.Fatalf("OpenCode data folders in %s: %v, want one", root, datas)
	}
	scratch := w.T.TempDir()
	data := filepath.Join(scratch, "data")
	if out, err := exec.Command("cp", "-a", "--", datas[0], data).CombinedOutput(); err != nil {
		w.T.Fatalf("copy %s: %v: %s", datas[0], err, out)
	}
	env := hostEnv(scratch, data)
	list := w.runOpenCode(env, scratch, "session", "list", "--format", "json")
	var sessions []struct {
		ID       string `json:"id"`
		ParentID string `json:"parentID"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(list), &sessions); err != nil {
		w.T.Fatalf("opencode session list printed %q: %v", list, err)
	}
	var top []string
	for _, s := range sessions {
		if s.ParentID == "" {
			top = append(top, s.ID)
		}
	}
	if len(top) != 1 {
		w.T.Fatalf("sessions saved in %s: %v, want one", datas[0], top)
	}
	return parseSession(w.T, w.runOpenCode(env, scratch, "export", top[0]))
}

// hostEnv is the environment of OpenCode run on the host by the tests:
// HOME and the XDG folders in scratch (its data folder data), and the
// switches that keep it local.
func hostEnv(scratch, data string) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + scratch, "TMPDIR=" + scratch,
		"XDG_DATA_HOME=" + data, "XDG_CONFIG_HOME=" + filepath.Join(scratch, "config"),
		"XDG_CACHE_HOME=" + filepath.Join(scratch, "cache"), "XDG_STATE_HOME=" + filepath.Join(scratch, "state"),
		"OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_AUTOUPDATE=1", "OPENCODE_DISABLE_SHARE=1",
		"OPENCODE_DISABLE_LSP_DOWNLOAD=1", "OPENCODE_DISABLE_DEFAULT_PLUGINS=1", "OPENCODE_DISABLE_CLAUDE_CODE=1",
		"OPENCODE_DISABLE_EXTERNAL_SKILLS=1", "npm_config_registry=http://127.0.0.1:9/",
	}
}

// runOpenCode runs the world's OpenCode on the host (see runOpenCodeOn).
func (w *world) runOpenCode(env []string, dir string, args ...string) []byte {
	w.T.Helper()
	return runOpenCodeOn(w.T, w.oc, env, dir, args...)
}

// runOpenCodeOn runs OpenCode bin on the host in a process group of its
// own, killed if it runs past its time, and returns its stdout. Its stdout
// is a file, not a pipe: OpenCode exits before a pipe drains and loses what
// it wrote past 64 KiB.
func runOpenCodeOn(t *testing.T, bin string, env []string, dir string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env, cmd.Dir = env, dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	stdout, err := os.CreateTemp(t.TempDir(), "stdout-")
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("opencode %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	out, err := os.ReadFile(stdout.Name())
	if err != nil {
		t.Fatal(err)
	}
	return out
}
