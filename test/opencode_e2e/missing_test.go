package opencodee2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// openCodeTests are the tests that need OpenCode (each a subtest per
// version).
var openCodeTests = []string{
	"TestPauseMidTool", "TestPauseMidStream", "TestPauseHeldReply", "TestPauseFourTimes",
	"TestCrashResumesSavedTurn", "TestCrashNoModelResponse", "TestCrashResumeWithOldPython",
	"TestLargeSessionExportReadWhole", "TestPausedTimeCountsTowardToolTimeout", "TestRolloutURLEscapedInOpenCode",
	"TestHostileTaskReachesModel", "TestOpenCodeInterface",
}

// TestMissingOpenCode: with OpenCode missing, the subtest of every test
// that needs it, for every version, fails under CI and skips elsewhere,
// with a message naming the version and scripts/install-opencode.sh, and
// the test binary prints one line per missing version. It runs this test
// binary again with OPENCODE_E2E_TOOLS naming an empty folder.
func TestMissingOpenCode(t *testing.T) {
	t.Parallel()
	tools := t.TempDir()
	run := "^(" + strings.Join(openCodeTests, "|") + ")$"
	for _, ci := range []bool{true, false} {
		cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
		var env []string
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			if k != "CI" && k != toolsEnv && k != childEnv {
				env = append(env, kv)
			}
		}
		env = append(env, toolsEnv+"="+tools, childEnv+"=1")
		if ci {
			env = append(env, "CI=true")
		}
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		want, verdict := "SKIP", "skips"
		if ci {
			want, verdict = "FAIL", "fails"
		}
		for _, v := range openCodeVersions {
			missing := regexp.QuoteMeta(filepath.Join(tools, "opencode-"+v)) + `/node_modules/opencode-linux-\w+/bin/opencode`
			why := `real OpenCode ` + regexp.QuoteMeta(v) + ` is not installed at ` + missing +
				` .*: install it with ` + "`" + `scripts/install-opencode\.sh ` + regexp.QuoteMeta(v) + "`"
			if line := regexp.MustCompile(`(?m)^opencode_e2e: ` + why + `; its subtests ` + verdict[:len(verdict)-1]); !line.Match(out) {
				t.Errorf("CI=%v: no line saying OpenCode %s is missing and its subtests %s; output:\n%s", ci, v, verdict, out)
			}
			for _, test := range openCodeTests {
				name := test + "/" + v
				// go test -v prints a test's log under a "=== CONT" or
				// "=== NAME" line naming it, and its verdict on its own line.
				msg := regexp.MustCompile(`(?m)^=== (?:CONT|NAME) +` + regexp.QuoteMeta(name) + `\n +\w+\.go:\d+: ` + why + `$`)
				if !msg.Match(out) || !strings.Contains(string(out), "--- "+want+": "+name+" (") {
					t.Errorf("CI=%v: %s does not %s naming scripts/install-opencode.sh; output:\n%s", ci, name, verdict, out)
				}
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

// TestWrongOpenCodeVersion: a subtest runs only the version it is named
// for. With OPENCODE_E2E_TOOLS holding 1.17.11's install under the name
// opencode-1.18.33, the 1.18.33 subtest fails (CI or not), saying what the
// binary reported and naming the install script.
func TestWrongOpenCodeVersion(t *testing.T) {
	t.Parallel()
	have := openCodeBin(t, openCodeVersions[0])
	old, want := openCodeVersions[0], openCodeVersions[len(openCodeVersions)-1]
	tools := t.TempDir()
	if err := os.Symlink(filepath.Join(filepath.Dir(openCodePath(old)), "..", "..", ".."), filepath.Join(tools, "opencode-"+want)); err != nil {
		t.Fatal(err)
	}
	name := "TestRolloutURLEscapedInOpenCode/" + want
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k != "CI" && k != toolsEnv && k != childEnv {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, toolsEnv+"="+tools, childEnv+"=1")
	out, err := cmd.CombinedOutput()
	msg := regexp.MustCompile(`(?m)^ +\w+\.go:\d+: \S+/opencode-` + regexp.QuoteMeta(want) + `/node_modules/\S+/opencode --version printed "` +
		regexp.QuoteMeta(old) + `" \(<nil>\), want ` + regexp.QuoteMeta(want) + `: reinstall it with ` + "`" + `scripts/install-opencode\.sh ` + regexp.QuoteMeta(want) + "`$")
	if err == nil || !msg.Match(out) || !strings.Contains(string(out), "--- FAIL: "+name+" (") {
		t.Errorf("%s with %s installed in its place: %v; want a failure naming both versions; output:\n%s", name, have.bin, err, out)
	}
}
