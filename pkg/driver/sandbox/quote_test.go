package sandbox

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/testkit"
)

// helperEnv makes the test binary, re-run by a test, act as the helper
// process: it prints its arguments (after "--"), the environment variables
// named Q_*, and its working folder as one JSON object, every string
// hex-encoded so that no byte is lost in the JSON.
const helperEnv = "NGH_QUOTE_TEST_HELPER"

type helperReport struct {
	Args []string          `json:"args"`
	Env  map[string]string `json:"env"`
	Cwd  string            `json:"cwd"`
}

// TestMain: the quoting tests' helper is this binary run again, and they
// wait for it to exit.
func TestMain(m *testing.M) {
	testkit.HelperExitsAtOnce()
	os.Exit(m.Run())
}

func TestQuoteHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for the quoting tests")
	}
	i := slices.Index(os.Args, "--")
	rep := helperReport{Args: []string{}, Env: map[string]string{}}
	for _, a := range os.Args[i+1:] {
		rep.Args = append(rep.Args, hex.EncodeToString([]byte(a)))
	}
	for _, kv := range os.Environ() {
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "Q_") {
			rep.Env[k] = hex.EncodeToString([]byte(v))
		}
	}
	cwd, _ := os.Getwd()
	rep.Cwd = hex.EncodeToString([]byte(cwd))
	_ = json.NewEncoder(os.Stdout).Encode(rep)
	os.Exit(0)
}

func unhex(t *testing.T, s string) string {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// hostileWords would each run `touch marker`, expand, or split if a shell
// saw them unquoted.
func hostileWords(marker string) []string {
	return []string{
		"$(touch " + marker + ")",
		"`touch " + marker + "`",
		"; touch " + marker,
		"; rm -rf " + marker + "-nothing",
		"&& touch " + marker,
		"|| touch " + marker,
		"| touch " + marker,
		"> " + marker,
		"'",
		"''",
		"'; touch " + marker + "; '",
		`"`,
		`"; touch ` + marker + `; "`,
		`\`,
		`\'`,
		`'\''`,
		"line1\nline2\ntouch " + marker,
		"\ttab\t",
		" leading and trailing spaces ",
		"*",
		"?",
		"[a-z]*",
		"~",
		"~root",
		"$HOME",
		"${PATH}",
		"$((1+1))",
		"!!",
		"#not a comment",
		"a#b",
		"{a,b}",
		"-n",
		"-e",
		"--",
		"-",
		"",
		"ünïcödé ✓ 日本語 😀",
		"\xff\xfe\x80 invalid utf-8",
		"\x01\x02\x1b[31mcontrol\x7f",
		"=",
		"A=B",
		"%s%n",
	}
}

// big is a 64 KiB string of random non-NUL bytes (quotes included).
func big(t *testing.T) string {
	t.Helper()
	b := make([]byte, 64<<10)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		if b[i] == 0 {
			b[i] = '\''
		}
	}
	return string(b)
}

// shellWords runs `printf '%s\0' WORDS` through a real /bin/sh -c, in dir
// (which holds a file, so that an unquoted glob would expand), and returns
// the words printf received.
func shellWords(t *testing.T, dir, words string) []string {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `printf '%s\0' `+words)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/home-should-not-appear"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sh: %v: %s", err, stderr.Bytes())
	}
	got := strings.Split(string(out), "\x00")
	return got[:len(got)-1]
}

func noMarker(t *testing.T, marker string) {
	t.Helper()
	matches, _ := filepath.Glob(marker + "*")
	if len(matches) > 0 {
		t.Fatalf("a quoted word was executed: %v exist", matches)
	}
}

func TestQuoteLeavesSafeWordsAlone(t *testing.T) {
	for _, w := range []string{"abc", "/usr/bin/env", "a=b", "-n", "x@y%z+1:2,3./_-"} {
		if got := Quote(w); got != w {
			t.Errorf("Quote(%q) = %q, want it unchanged", w, got)
		}
	}
	if got := Quote(""); got != "''" {
		t.Errorf("Quote(\"\") = %q", got)
	}
	for _, w := range []string{"a b", "$x", "'", "~", "*", "é"} {
		if got := Quote(w); got == w {
			t.Errorf("Quote(%q) left it unquoted", w)
		}
	}
}

func TestQuoteEachWordThroughShell(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "glob-bait"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "pwned")
	for _, w := range append(hostileWords(marker), big(t)) {
		got := shellWords(t, dir, Quote(w))
		if len(got) != 1 || got[0] != w {
			t.Errorf("Quote(%.60q) through sh gave %d words %.60q", w, len(got), got)
		}
	}
	noMarker(t, marker)
}

func TestQuoteArgvThroughShell(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "glob-bait"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "pwned")
	words := append(hostileWords(marker), big(t))
	got := shellWords(t, dir, QuoteArgv(words))
	if len(got) != len(words) {
		t.Fatalf("QuoteArgv: got %d words, want %d", len(got), len(words))
	}
	for i := range words {
		if got[i] != words[i] {
			t.Errorf("word %d: got %.60q, want %.60q", i, got[i], words[i])
		}
	}
	if QuoteArgv(nil) != "" {
		t.Errorf("QuoteArgv(nil) = %q", QuoteArgv(nil))
	}
	noMarker(t, marker)
}

// TestCommandLineDeliversExactArgvEnvAndDir runs CommandLine's output
// through a real /bin/sh -c: the helper (this test binary) must receive
// exactly the argv, the environment values and the folder.
func TestCommandLineDeliversExactArgvEnvAndDir(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "pwned")
	words := append(hostileWords(marker), big(t))
	env := map[string]string{helperEnv: "1"}
	for i, w := range hostileWords(marker) {
		env[fmt.Sprintf("Q_%d", i)] = w
	}
	env["Q_BIG"] = big(t)[:16<<10] // argv and env share one 128 KiB sh -c argument
	// A working folder whose name is hostile too (run in the marker's
	// folder, its touch would make the marker).
	dir := filepath.Join(t.TempDir(), "d $(touch "+filepath.Base(marker)+") ' \" ; `touch "+filepath.Base(marker)+"` *")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	argv := append([]string{exe, "-test.run=^TestQuoteHelperProcess$", "--"}, words...)
	line, err := CommandLine(ExecRequest{Argv: argv, Env: env, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", line)
	cmd.Dir = filepath.Dir(marker)
	// A bare environment, but for GORACE (set by TestMain): the helper
	// exits at once.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GORACE=" + os.Getenv("GORACE")}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sh -c CommandLine: %v: %s", err, stderr.Bytes())
	}
	var rep helperReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	if len(rep.Args) != len(words) {
		t.Fatalf("helper got %d arguments, want %d", len(rep.Args), len(words))
	}
	for i, w := range words {
		if got := unhex(t, rep.Args[i]); got != w {
			t.Errorf("argument %d: got %.60q, want %.60q", i, got, w)
		}
	}
	for k, v := range env {
		if !strings.HasPrefix(k, "Q_") {
			continue
		}
		if got := unhex(t, rep.Env[k]); got != v {
			t.Errorf("env %s: got %.60q, want %.60q", k, got, v)
		}
	}
	if got := unhex(t, rep.Cwd); got != dir {
		t.Errorf("cwd: got %q, want %q", got, dir)
	}
	noMarker(t, marker)
}

func TestCommandLineWithoutDirOrEnv(t *testing.T) {
	line, err := CommandLine(ExecRequest{Argv: []string{"echo", "a b"}})
	if err != nil {
		t.Fatal(err)
	}
	if line != "exec echo 'a b'" {
		t.Errorf("CommandLine = %q", line)
	}
	if _, err := CommandLine(ExecRequest{}); err == nil {
		t.Error("empty argv accepted")
	}
}

func TestCommandLineRejectsEnvKeysThatAreNotNames(t *testing.T) {
	for _, k := range []string{"", "A=B", "=", "1A", "A B", "A-B", "A.B", "ä", "A\nB", "$(touch x)", "A;B", "-i"} {
		if _, err := CommandLine(ExecRequest{Argv: []string{"true"}, Env: map[string]string{k: "v"}}); err == nil {
			t.Errorf("env key %q accepted", k)
		}
		if err := CheckEnv(map[string]string{k: "v"}); err == nil {
			t.Errorf("CheckEnv accepted %q", k)
		}
	}
	for _, k := range []string{"A", "_", "a1", "A_B_9", "_x"} {
		if err := CheckEnv(map[string]string{k: "any 'value' $(x)\n"}); err != nil {
			t.Errorf("CheckEnv(%q): %v", k, err)
		}
	}
}
