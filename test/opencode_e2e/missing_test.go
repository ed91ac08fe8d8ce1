package opencodee2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// openCodeTests are the tests that need OpenCode.
var openCodeTests = []string{
	"TestPauseMidTool", "TestPauseHeldReply", "TestPauseFourTimes",
	"TestCrashResumesSavedTurn", "TestCrashNoModelResponse", "TestCrashResumeWithOldPython",
}

// TestMissingOpenCode: with OpenCode missing, every test that needs it
// fails under CI and skips elsewhere, with a message naming
// scripts/install-opencode.sh. It runs this test binary again with
// OPENCODE_E2E_BIN naming a file that does not exist.
func TestMissingOpenCode(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "no-opencode")
	run := "^(" + strings.Join(openCodeTests, "|") + ")$"
	for _, ci := range []bool{true, false} {
		cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
		var env []string
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			if k != "CI" && k != binEnv && k != childEnv {
				env = append(env, kv)
			}
		}
		env = append(env, binEnv+"="+missing, childEnv+"=1")
		if ci {
			env = append(env, "CI=true")
		}
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		want, verdict := "SKIP", "skips"
		if ci {
			want, verdict = "FAIL", "fails"
		}
		for _, name := range openCodeTests {
			// go test -v prints a test's log under a "=== CONT" or
			// "=== NAME" line naming it, and its verdict on its own line.
			msg := regexp.MustCompile(`(?m)^=== (?:CONT|NAME) +` + name + `\n +\w+\.go:\d+: real OpenCode ` +
				regexp.QuoteMeta(openCodeVersion) + ` is not installed at ` + regexp.QuoteMeta(missing) +
				` .*: install it with ` + "`" + `scripts/install-opencode\.sh ` + regexp.QuoteMeta(openCodeVersion) + "`$")
			if !msg.Match(out) || !strings.Contains(string(out), "--- "+want+": "+name+" (") {
				t.Errorf("CI=%v: %s does not %s naming scripts/install-opencode.sh; output:\n%s", ci, name, verdict, out)
			}
		}
		if ci && err == nil {
			t.Errorf("CI=true: the test binary passed with OpenCode missing")
		}
		if !ci && err != nil {
			t.Errorf("without CI: the test binary failed with OpenCode missing: %v", err)
		}
		if t.Failed() {
			return
		}
	}
}
