package opencodee2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"os/exec"

	"github.com/ngharness/ngharness/internal/testkit"
)

// TestOpenCodeInterface: each version offers what the adapter and ngresume
// use of it. The CLI: `run --format`, `session list --format`, `export`,
// `serve --hostname --port`. The authenticated server: GET /global/health
// answers healthy with the version; its OpenAPI spec (GET /doc) has GET
// /session, GET and POST /session/{sessionID}/message with the directory
// parameter, the POST body taking messageID and parts (ngresume posts the
// last user message back with empty parts). The differences measured
// between the versions are checked too (runFlagsDiffer): 1.18.33 renamed
// run's --dangerously-skip-permissions to --auto and added -i/--interactive
// and six /api/session/... routes; the adapter uses none of them
// (permissions come from the config's "permission").
func TestOpenCodeInterface(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testOpenCodeInterface)
}

func testOpenCodeInterface(t *testing.T, ver openCode) {
	scratch := t.TempDir()
	env := hostEnv(scratch, scratch+"/data")
	flags := regexp.MustCompile(`--[a-z][a-z-]*`)
	for cmd, want := range map[string][]string{
		"run":          {"--format"},
		"session list": {"--format"},
		"export":       nil,
		"serve":        {"--hostname", "--port"},
	} {
		help := helpOf(t, ver.bin, env, scratch, cmd)
		have := flags.FindAllString(help, -1)
		for _, f := range want {
			if !slices.Contains(have, f) {
				t.Errorf("opencode %s --help lists no %s: %s", cmd, f, help)
			}
		}
		if d, ok := runFlagsDiffer[ver.version]; ok && cmd == "run" {
			for _, f := range d.has {
				if !slices.Contains(have, f) {
					t.Errorf("opencode %s run --help lists no %s, which it was measured to have", ver.version, f)
				}
			}
			for _, f := range d.lacks {
				if slices.Contains(have, f) {
					t.Errorf("opencode %s run --help lists %s, which it was measured to lack", ver.version, f)
				}
			}
		}
		if cmd == "run" {
			slices.Sort(have)
			t.Logf("opencode %s run flags: %s", ver.version, strings.Join(slices.Compact(have), " "))
		}
	}

	base, password := startServe(t, ver.bin, env, scratch)
	get := func(path string) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		req.SetBasicAuth("opencode", password)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v: %.300s", path, resp.StatusCode, err, data)
		}
		return data
	}
	var health struct {
		Healthy bool   `json:"healthy"`
		Version string `json:"version"`
	}
	if err := json.Unmarshal(get("/global/health"), &health); err != nil || !health.Healthy || health.Version != ver.version {
		t.Errorf("GET /global/health: %+v (%v), want healthy, version %s", health, err, ver.version)
	}
	type operation struct {
		Parameters  []parameter `json:"parameters"`
		RequestBody struct {
			Content map[string]struct {
				Schema struct {
					Properties map[string]json.RawMessage `json:"properties"`
				} `json:"schema"`
			} `json:"content"`
		} `json:"requestBody"`
	}
	var doc struct {
		Paths map[string]map[string]operation `json:"paths"`
	}
	if err := json.Unmarshal(get("/doc"), &doc); err != nil {
		t.Fatalf("GET /doc: %v", err)
	}
	has := func(path, method string) (operation, bool) {
		op, ok := doc.Paths[path][method]
		if !ok {
			t.Errorf("the server's spec has no %s %s", strings.ToUpper(method), path)
		}
		return op, ok
	}
	has("/global/health", "get")
	has("/session", "get")
	for _, m := range []string{"get", "post"} {
		op, ok := has("/session/{sessionID}/message", m)
		if ok && !slices.ContainsFunc(op.Parameters, func(p parameter) bool { return p.Name == "directory" }) {
			t.Errorf("%s /session/{sessionID}/message takes no directory parameter: %+v", strings.ToUpper(m), op.Parameters)
		}
		if m == "post" && ok {
			props := op.RequestBody.Content["application/json"].Schema.Properties
			if props["messageID"] == nil || props["parts"] == nil {
				t.Errorf("POST /session/{sessionID}/message takes no messageID or parts: %v", props)
			}
		}
	}
	if d, ok := runFlagsDiffer[ver.version]; ok {
		for _, p := range d.routes {
			if doc.Paths[p] == nil {
				t.Errorf("opencode %s serve has no %s, which it was measured to have", ver.version, p)
			}
		}
		for _, p := range d.noRoutes {
			if doc.Paths[p] != nil {
				t.Errorf("opencode %s serve has %s, which it was measured to lack", ver.version, p)
			}
		}
	}
	t.Logf("opencode %s serve: healthy, %d routes in its spec", ver.version, len(doc.Paths))
}

// parameter is a parameter of an operation in OpenCode's OpenAPI spec.
type parameter struct {
	Name string `json:"name"`
}

// newIn118 are the server routes 1.18.33 has and 1.17.11 lacks.
var newIn118 = []string{
	"/api/session/active", "/api/session/{sessionID}/event", "/api/session/{sessionID}/history",
	"/api/session/{sessionID}/interrupt", "/api/session/{sessionID}/message/{messageID}",
	"/api/session/{sessionID}/permission/{requestID}",
}

// runFlagsDiffer are the flags of `opencode run` and the server routes
// measured to differ between the versions: what each version has, and
// lacks, of them.
var runFlagsDiffer = map[string]struct{ has, lacks, routes, noRoutes []string }{
	"1.17.11": {has: []string{"--dangerously-skip-permissions"}, lacks: []string{"--auto", "--interactive"}, noRoutes: newIn118},
	"1.18.33": {has: []string{"--auto", "--interactive"}, lacks: []string{"--dangerously-skip-permissions"}, routes: newIn118},
}

// helpOf is what `opencode CMD --help` prints (on stderr), run on the host
// in a process group of its own, killed if it runs past its time.
func helpOf(t *testing.T, bin string, env []string, dir, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, bin, append(strings.Fields(cmd), "--help")...)
	c.Env, c.Dir = env, dir
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 5 * time.Second
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("opencode %s --help: %v: %s", cmd, err, out)
	}
	return string(out)
}

// startServe starts `opencode serve` on loopback with a random password,
// in a process group of its own killed at the test's end, and returns its
// base URL once it answers GET /global/health.
func startServe(t *testing.T, bin string, env []string, dir string) (string, string) {
	t.Helper()
	pw := make([]byte, 16)
	rand.Read(pw)
	password := hex.EncodeToString(pw)
	cmd := exec.Command(bin, "serve", "--hostname", "127.0.0.1", "--port", "0")
	cmd.Env, cmd.Dir = append(env, "OPENCODE_SERVER_PASSWORD="+password), dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	found := make(chan string, 1)
	go func() {
		listening := regexp.MustCompile(`listening on (http://[0-9.:]+)`)
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
	var base string
	select {
	case base = <-found:
	case <-time.After(patience):
		t.Fatalf("opencode serve printed no listening line within %s", patience)
	}
	// A request sent just as the port opens can hang: poll with a short
	// timeout.
	testkit.Eventually(t, "opencode serve at "+base+" healthy", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/global/health", nil)
		req.SetBasicAuth("opencode", password)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return base, password
}
