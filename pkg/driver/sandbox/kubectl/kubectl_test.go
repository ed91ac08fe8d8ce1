package kubectl_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/internal/sandboxtest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/kubectl"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// TestMain builds the fake kubectl client (internal/fake/cli) for this test
// binary.
func TestMain(m *testing.M) { os.Exit(testkit.Main(m, "kubectl")) }

type world struct {
	base string
	b    *kubectl.Backend
}

func newWorld(t *testing.T) *world {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the fake kubectl runs pods in mount namespaces of their own: it needs root")
	}
	base := t.TempDir()
	b, err := kubectl.New(kubectl.Options{
		Binary: testkit.Bin("kubectl"), Env: []string{"FAKECLI_BASE=" + base, "FAKECLI_LOG=" + filepath.Join(base, "calls")}, Namespace: "rl",
		Image: "ubuntu:24.04", Root: "/sandbox/.ngharness", Workdir: "/sandbox/work",
		SnapshotDir: filepath.Join(base, "tars"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { noRefusals(t, filepath.Join(base, "calls")) })
	t.Cleanup(func() {
		ents, _ := os.ReadDir(filepath.Join(base, "sandboxes"))
		for _, e := range ents {
			if ns, pod, ok := strings.Cut(strings.TrimPrefix(e.Name(), "k8s-"), "."); ok {
				_ = b.Remove(context.Background(), ns+"/"+pod)
			}
		}
	})
	return &world{base: base, b: b}
}

// host is the fake's folder of the pod namespace/pod.
func (w *world) host(id string) string {
	ns, pod, _ := strings.Cut(id, "/")
	return filepath.Join(w.base, "sandboxes", "k8s-"+ns+"."+pod)
}

// TestConformance runs the sandbox conformance suite over the kubectl
// backend and the fake kubectl (which also prints kubectl's own notices,
// "Defaulted container" and "command terminated with exit code N", that
// must not reach a command's output): exec semantics and quoting, the
// timeout killed inside, uploads through stdin, run/wait/delete and tar
// snapshots forked into new pods, a pod deleted under a command
// (sandbox.ErrGone naming it), and the API server out of reach
// (sandbox.ErrTransport).
func TestConformance(t *testing.T) {
	w := newWorld(t)
	sandboxtest.Run(t, sandboxtest.Fixture{
		Lender: w.b, Backend: w.b, HostFolder: w.host, MountPoint: local.DefaultMountPoint,
		Delete: func(id string) error { return w.b.Remove(context.Background(), id) },
		Down: func() func() {
			down := filepath.Join(w.base, "down")
			os.WriteFile(down, nil, 0o644)
			return func() { os.Remove(down) }
		},
	})
}

// TestIDsAndClientFailures proves the sandbox id forms (pod,
// namespace/pod, namespace/pod/container) and that kubectl's own failures
// map to the error classes.
func TestIDsAndClientFailures(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	for id, want := range map[string]kubectl.Ref{
		"p1":         {Namespace: "rl", Pod: "p1"},
		"ns/p1":      {Namespace: "ns", Pod: "p1"},
		"ns/p1/main": {Namespace: "ns", Pod: "p1", Container: "main"},
	} {
		got, err := w.b.ParseID(id)
		if err != nil || got != want {
			t.Errorf("ParseID(%q) = %+v %v, want %+v", id, got, err, want)
		}
	}
	for _, bad := range []string{"", "a/b/c/d", "NS/p", "ns/-p", "ns/p;x", "ns//p", "ns/p/ c"} {
		if _, err := w.b.ParseID(bad); err == nil {
			t.Errorf("ParseID(%q) accepted", bad)
		}
	}
	ctx := context.Background()
	sb, err := w.b.Connect(ctx, sandbox.Descriptor{Provider: "kubectl", SandboxID: "rl/never-made"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrGone) || !strings.Contains(err.Error(), "never-made") {
		t.Errorf("exec in a missing pod: %v", err)
	}
	if _, err := w.b.Create(ctx, "Not_A_Label"); err == nil {
		t.Errorf("a pod name that is not a DNS label was accepted")
	}
	if _, err := w.b.Fork(ctx, "no-such-snapshot", "fork"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("fork of a missing snapshot: %v", err)
	}
	if _, err := w.b.Snapshot(ctx, "rl/x", "../evil"); err == nil {
		t.Errorf("a snapshot name with a slash was accepted")
	}
}

// kubectlRun runs the fake kubectl in base and returns its exit code,
// stdout and stderr.
func kubectlRun(t *testing.T, base, stdin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(testkit.Bin("kubectl"), args...)
	cmd.Env = append(os.Environ(), "FAKECLI_BASE="+base)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// TestFakeTakesWhatKubectlTakes proves the fake kubectl is as strict as a
// real one (kubectl's own words and exit code 1, from kubernetes/kubectl's
// pkg/cmd: exec, run, delete, wait, get and pflag's flag errors): it
// refuses the command lines kubectl refuses, and takes the forms kubectl
// takes (flags after the pod's name, joined shorthands, global flags
// before the subcommand, stdin only with -i).
func TestFakeTakesWhatKubectlTakes(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	b := w.base
	if code, out, errs := kubectlRun(t, b, "", "run", "p", "-n", "rl", "--image=busybox:1.36", "--restart=Never", "--command", "--", "sleep", "infinity"); code != 0 || out != "pod/p created\n" {
		t.Fatalf("kubectl run: %d %q %q", code, out, errs)
	}
	refused := []struct {
		args []string
		want string // the whole of stderr
	}{
		{[]string{"exec", "-i", "-n", "rl", "p", "sh", "-c", "true"},
			"error: exec [POD] [COMMAND] is not supported anymore. Use exec [POD] -- [COMMAND] instead\nSee 'kubectl exec -h' for help and examples\n"},
		{[]string{"exec", "-i", "-n", "rl", "p", "--bogus", "--", "true"}, "error: unknown flag: --bogus\nSee 'kubectl exec --help' for usage.\n"},
		{[]string{"exec", "-x", "-n", "rl", "p", "--", "true"}, "error: unknown shorthand flag: 'x' in -x\nSee 'kubectl exec --help' for usage.\n"},
		{[]string{"exec", "-n", "rl", "p", "--"}, "error: you must specify at least one command for the container\n"},
		{[]string{"exec", "-n", "rl", "--", "true"},
			"error: expected 'exec (POD | TYPE/NAME) COMMAND [ARG1] [ARG2] ... [ARGN]'.\nPOD or TYPE/NAME is a required argument for the exec command\nSee 'kubectl exec -h' for help and examples\n"},
		{[]string{"exec", "-n", "rl", "p", "-c"}, "error: flag needs an argument: 'c' in -c\nSee 'kubectl exec --help' for usage.\n"},
		{[]string{"run", "q", "-n", "rl"}, "error: required flag(s) \"image\" not set\n"},
		{[]string{"run", "-n", "rl", "--image=busybox", "--", "sleep", "1"}, "error: NAME is required for run\n"},
		{[]string{"run", "q", "-n", "rl", "--image=busybox", "--restart=Sometimes"}, "error: invalid restart policy: Sometimes, valid values are: Always, OnFailure, Never\n"},
		{[]string{"run", "q", "-n", "rl", "--image=busybox", "--overrides={not json"}, "error: Invalid JSON Patch\n"},
		{[]string{"run", "q", "-n", "rl", "--image=busybox", "--labels=a"}, "error: unexpected label spec: a\n"},
		{[]string{"run", "q", "-n", "rl", "--image=busybox", "--rm"}, "error: --rm should only be used for attached containers\n"},
		{[]string{"run", "q", "-n", "rl", "--image", "Bad Image"}, "error: invalid image name \"Bad Image\": invalid reference format\n"},
		{[]string{"delete", "pod", "p", "-n", "rl", "--now", "--grace-period=0"}, "error: --now and --grace-period cannot be specified together\n"},
		{[]string{"delete", "pod", "p", "-n", "rl", "--force", "--grace-period=5"}, "error: --force and --grace-period greater than 0 cannot be specified together\n"},
		{[]string{"delete", "pod", "p", "-n", "rl", "--grace-period=soon"},
			"error: invalid argument \"soon\" for \"--grace-period\" flag: strconv.ParseInt: parsing \"soon\": invalid syntax\nSee 'kubectl delete --help' for usage.\n"},
		{[]string{"delete", "pod", "p", "-n", "rl", "--wait=maybe"},
			"error: invalid argument \"maybe\" for \"--wait\" flag: strconv.ParseBool: parsing \"maybe\": invalid syntax\nSee 'kubectl delete --help' for usage.\n"},
		{[]string{"get", "pod", "p", "-n", "rl", "-o", "jsonpath"}, "error: template format specified but no template given\n"},
		{[]string{"get", "pod", "p", "-n", "rl", "-o", "xml"},
			"error: unable to match a printer suitable for the output format \"xml\", allowed formats are: custom-columns,custom-columns-file,go-template,go-template-file,json,jsonpath,jsonpath-as-json,jsonpath-file,name,template,templatefile,wide,yaml\n"},
		{[]string{"wait", "pod/p", "-n", "rl", "--for=condition=Ready", "--timeout=5"},
			"error: invalid argument \"5\" for \"--timeout\" flag: time: missing unit in duration \"5\"\nSee 'kubectl wait --help' for usage.\n"},
		{[]string{"wait", "pod/p", "-n", "rl"}, "error: unrecognized condition: \"\"\n"},
		{[]string{"frobnicate", "p"}, "error: unknown command \"frobnicate\" for \"kubectl\"\n"},
	}
	for _, c := range refused {
		code, _, errs := kubectlRun(t, b, "", c.args...)
		if code != 1 || errs != c.want {
			t.Errorf("kubectl %q: exit %d, stderr %q; want exit 1, stderr %q", c.args, code, errs, c.want)
		}
	}
	// What the pod exists for: the API server's own refusals.
	if code, _, errs := kubectlRun(t, b, "", "exec", "-n", "rl", "p", "-c", "other", "--", "true"); code != 1 || errs != "Error from server (BadRequest): container other is not valid for pod p\n" {
		t.Errorf("exec into a container the pod lacks: %d %q", code, errs)
	}
	if code, _, errs := kubectlRun(t, b, "", "get", "pod", "nope", "-n", "rl"); code != 1 || errs != "Error from server (NotFound): pods \"nope\" not found\n" {
		t.Errorf("get a missing pod: %d %q", code, errs)
	}

	taken := []struct {
		stdin string
		args  []string
		out   string
	}{
		{"in", []string{"exec", "p", "-n", "rl", "-i", "-c", "p", "--", "cat"}, "in"},
		{"in", []string{"exec", "p", "--namespace=rl", "-q", "--", "cat"}, ""}, // no -i: no stdin
		{"in", []string{"--context", "c1", "-nrl", "exec", "-iq", "pod/p", "--", "cat"}, "in"},
		{"", []string{"get", "pod/p", "-n", "rl", "-o=jsonpath={.status.phase}"}, "Running"},
		{"", []string{"get", "pods", "p", "-n", "rl", "-o", "name"}, "pod/p\n"},
		{"", []string{"wait", "--for", "condition=Ready=true", "pod", "p", "-n", "rl", "--timeout=1m"}, "pod/p condition met\n"},
		{"", []string{"delete", "pod/p", "-n", "rl", "--now"}, "pod \"p\" deleted\n"},
		{"", []string{"delete", "pod", "p", "-n", "rl", "--ignore-not-found", "--force", "--grace-period", "0", "--wait=false"}, ""},
	}
	for _, c := range taken {
		code, out, errs := kubectlRun(t, b, c.stdin, c.args...)
		if code != 0 || out != c.out {
			t.Errorf("kubectl %q: exit %d, stdout %q (stderr %q); want exit 0, stdout %q", c.args, code, out, errs, c.out)
		}
	}
}

// TestBackendSendsOnlyWhatKubectlTakes proves that every command line the
// backend sends (exec, upload, a cancelled exec and its kill, a timeout,
// create, snapshot, fork, open, remove, a missing pod) is one the fake, as
// strict as kubectl, takes: the fake notes each call and each refusal.
func TestBackendSendsOnlyWhatKubectlTakes(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the fake kubectl runs pods in mount namespaces of their own: it needs root")
	}
	base := t.TempDir()
	logFile := filepath.Join(t.TempDir(), "calls")
	b, err := kubectl.New(kubectl.Options{
		Binary: testkit.Bin("kubectl"), Env: []string{"FAKECLI_BASE=" + base, "FAKECLI_LOG=" + logFile}, Namespace: "rl",
		Image: "ubuntu:24.04", Root: "/sandbox/.ngharness", Workdir: "/sandbox/work", SnapshotDir: filepath.Join(base, "tars"),
		RunArgs: []string{"--overrides={\"spec\":{}}"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		for _, id := range []string{"rl/one", "rl/two"} {
			_ = b.Remove(ctx, id)
		}
	})
	sb, err := b.Create(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Upload(ctx, sb.Workdir()+"/f", []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "f"}}); err != nil || string(res.Stdout) != "data" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: time.Second}); !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("timeout: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = sb.Exec(cctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
	cancel()
	if !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("a cancelled exec: %v", err)
	}
	snap, err := b.Snapshot(ctx, sb.ID(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	fork, err := b.Fork(ctx, snap, "two")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Open(ctx, fork.ID()); err != nil {
		t.Fatal(err)
	}
	other, err := b.Connect(ctx, sandbox.Descriptor{SandboxID: "rl/two/two"}) // with -c
	if err != nil {
		t.Fatal(err)
	}
	if res, err := other.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "f"}}); err != nil || string(res.Stdout) != "data" {
		t.Fatalf("exec in the fork's named container: %+v %v", res, err)
	}
	if _, err := b.Open(ctx, "rl/never"); !errors.Is(err, sandbox.ErrGone) {
		t.Fatalf("open a missing pod: %v", err)
	}
	for _, id := range []string{sb.ID(), fork.ID(), "rl/never"} {
		if err := b.Remove(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.RemoveSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}

	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		kind, rest, _ := strings.Cut(line, " ")
		if kind == "refused" {
			t.Errorf("the backend sent a command line kubectl refuses: %s", rest)
			continue
		}
		words := strings.Fields(rest)
		if len(words) > 1 {
			sub, _ := strconv.Unquote(words[1])
			seen[sub]++
		}
	}
	for _, sub := range []string{"exec", "run", "wait", "get", "delete"} {
		if seen[sub] == 0 {
			t.Errorf("the backend never ran kubectl %s (calls: %v)", sub, seen)
		}
	}
}

// noRefusals fails the test if the fake noted, in its log, a command line
// the real client would refuse (or the fake does not model).
func noRefusals(t *testing.T, log string) {
	data, _ := os.ReadFile(log)
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "refused "); ok {
			t.Errorf("the backend sent a command line kubectl refuses: %s", rest)
		}
	}
}

// TestSnapshotTakenAgainWhenFilesChanged proves that a snapshot whose tar
// reports that something changed while it read it (GNU tar's exit 1, seen
// when an exec made its fence file in the sandbox's root during a
// snapshot) is taken again rather than failed, and that what is kept is
// the whole second archive, not the first one's torn bytes: the fork holds
// the file. The pod's first tar is a stand-in that prints tar's message,
// writes half an archive and exits 1; every later one is the real tar.
func TestSnapshotTakenAgainWhenFilesChanged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the fake kubectl runs pods in mount namespaces of their own: it needs root")
	}
	base := t.TempDir()
	bin, calls := filepath.Join(base, "bin"), filepath.Join(base, "tar-calls")
	realTar, err := exec.LookPath("tar")
	if err != nil {
		t.Skip("no tar here")
	}
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho call >>" + sandbox.Quote(calls) + "\n" +
		"case \"$*\" in *-cf*) if [ \"$(wc -l <" + sandbox.Quote(calls) + ")\" -eq 1 ]; then\n" +
		"  printf 'torn' ; echo 'tar: sandbox/.ngharness: file changed as we read it' >&2; exit 1\nfi;;\nesac\n" +
		"exec " + sandbox.Quote(realTar) + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "tar"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := kubectl.New(kubectl.Options{
		Binary: testkit.Bin("kubectl"), Namespace: "rl", Image: "ubuntu:24.04", Root: "/sandbox/.ngharness", Workdir: "/sandbox/work",
		Env:         []string{"FAKECLI_BASE=" + base, "PATH=" + bin + ":" + os.Getenv("PATH")},
		SnapshotDir: filepath.Join(base, "tars"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		for _, id := range []string{"rl/one", "rl/two"} {
			_ = b.Remove(ctx, id)
		}
	})
	sb, err := b.Create(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Upload(ctx, sb.Workdir()+"/f", []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := b.Snapshot(ctx, sb.ID(), "s1")
	if err != nil {
		t.Fatalf("the snapshot failed on a tar that said files changed: %v", err)
	}
	if data, _ := os.ReadFile(calls); strings.Count(string(data), "\n") != 2 {
		t.Errorf("tar ran %d times, want twice (the changed one, then again)", strings.Count(string(data), "\n"))
	}
	fork, err := b.Fork(ctx, snap, "two")
	if err != nil {
		t.Fatalf("fork of the snapshot taken again: %v", err)
	}
	if res, err := fork.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "f"}}); err != nil || string(res.Stdout) != "kept" {
		t.Errorf("the fork's file: %+v %v", res, err)
	}
}
