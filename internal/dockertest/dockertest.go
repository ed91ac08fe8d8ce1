// Package dockertest is what the tests against a real Docker engine share:
// finding the engine (or skipping, saying why), naming and labelling what a
// test makes so that its cleanup removes exactly that, and looking into a
// container from the host (its files through overlay2's merged folder, its
// processes through its pid namespace).
//
// The engine is used when NGHARNESS_DOCKER_IMAGE names an image of it
// (.ci/run sets it once scripts/docker-engine.sh has an engine up). The
// client is NGHARNESS_DOCKER_CLIENT, else the `docker` on PATH when this
// package was initialized, before any TestMain put a fake docker first.
package dockertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/proctest"
)

// Environment variables.
const (
	// ImageEnv names the base image (a GNU userland) the tests run
	// containers of; unset, the real-Docker tests skip.
	ImageEnv = "NGHARNESS_DOCKER_IMAGE"
	// ClientEnv is the real docker client's path (default: docker on PATH
	// at initialization).
	ClientEnv = "NGHARNESS_DOCKER_CLIENT"
	// RunEnv, when set, is added to everything the tests make as the
	// RunLabelKey label: a test that runs others in a child process sets
	// it, and removes all of it afterwards even if the child was killed.
	RunEnv = "NGHARNESS_DOCKER_RUN"
)

// LabelKey marks what a test made: containers carry LabelKey=Prefix, and
// so do the images committed from them (a commit keeps the container's
// labels), even those a later commit of the same name left untagged.
const LabelKey = "io.ngharness.test"

// RunLabelKey carries RunEnv.
const RunLabelKey = "io.ngharness.test.run"

// RunArgs are added to every test container's `docker run`: none, so the
// containers have docker's default capabilities, as a user's would (ngsup
// needs no more there: a subreaper, signals and /proc; cgroups are
// read-only in a container either way, so it runs on signals). Where more
// is wanted, `--cap-add ALL --cap-drop SYS_RESOURCE` works on these
// machines; --privileged fails (their root lacks CAP_SYS_RESOURCE).
var RunArgs []string

// client is the real docker client, looked up before any TestMain runs.
var client = func() string {
	if p := os.Getenv(ClientEnv); p != "" {
		return p
	}
	p, _ := exec.LookPath("docker")
	return p
}()

// Client is the real docker client's path ("" when there is none).
func Client() string { return client }

// Engine is one test's use of the real engine. Make it with New.
type Engine struct {
	// Client is the docker client's absolute path; Image the base image.
	Client, Image string
	// Prefix starts the name of every container the test makes and is the
	// value of its LabelKey label.
	Prefix string
}

// Why is the reason the real-Docker tests cannot run here ("" when they
// can): not root, no image named, no client.
func Why() string {
	switch {
	case os.Geteuid() != 0:
		return "the real-Docker tests need root (the containers' files and processes are read on the host)"
	case os.Getenv(ImageEnv) == "":
		return ImageEnv + " is not set: no Docker engine was started for the tests (scripts/docker-engine.sh starts one; .ci/run sets it)"
	case client == "":
		return "no docker client on PATH (or in " + ClientEnv + ")"
	}
	return ""
}

// New returns the engine, or skips the test with one line saying why.
// With an image named, an engine that does not answer or lacks the image
// fails the test. Every container labelled with the Engine's prefix, and
// every image committed from one, is removed when the test ends.
func New(t testing.TB, name string) *Engine {
	t.Helper()
	if why := Why(); why != "" {
		t.Skip(why)
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	e := &Engine{Client: client, Image: os.Getenv(ImageEnv), Prefix: name + "-" + hex.EncodeToString(b[:])}
	if out, err := e.Docker("info", "--format", "{{.ServerVersion}}"); err != nil {
		t.Fatalf("%s=%s but the engine does not answer: %v", ImageEnv, e.Image, err)
	} else if strings.TrimSpace(out) == "" {
		t.Fatalf("%s=%s but docker info names no server", ImageEnv, e.Image)
	}
	if _, err := e.Docker("image", "inspect", "--format", "{{.Id}}", e.Image); err != nil {
		t.Fatalf("%s=%s: %v", ImageEnv, e.Image, err)
	}
	t.Cleanup(func() {
		if err := e.RemoveAll(); err != nil {
			t.Errorf("dockertest: %v", err)
		}
	})
	return e
}

// Label is the --label value of what the test makes.
func (e *Engine) Label() string { return LabelKey + "=" + e.Prefix }

// RunArgs are RunArgs and the test's label, for docker.Options.RunArgs.
// With RunEnv set, its label too.
func (e *Engine) RunArgs() []string {
	args := append(append([]string(nil), RunArgs...), "--label", e.Label())
	if run := os.Getenv(RunEnv); run != "" {
		args = append(args, "--label", RunLabelKey+"="+run)
	}
	return args
}

// SnapshotRepository is the image repository of the test's snapshots.
func (e *Engine) SnapshotRepository() string { return "ngharness-snapshot-" + e.Prefix }

// Docker runs the client and returns its stdout; a failure carries its
// stderr.
func (e *Engine) Docker(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Client, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// Containers lists the names of the test's containers (running or not).
func (e *Engine) Containers() []string { return e.Labelled(e.Label()) }

// Labelled lists the names of the containers labelled label (KEY=VALUE).
func (e *Engine) Labelled(label string) []string {
	out, err := e.Docker("ps", "-a", "--filter", "label="+label, "--format", "{{.Names}}")
	if err != nil {
		return nil
	}
	return strings.Fields(out)
}

// RemoveAll removes the test's containers, then every image committed from
// them (tagged or not).
func (e *Engine) RemoveAll() error { return e.RemoveLabelled(e.Label()) }

// RemoveLabelled removes the containers labelled label (KEY=VALUE), then
// every image that carries it (those committed from them).
func (e *Engine) RemoveLabelled(label string) error {
	var errs []string
	if names := e.Labelled(label); len(names) > 0 {
		if _, err := e.Docker(append([]string{"rm", "-f"}, names...)...); err != nil {
			errs = append(errs, err.Error())
		}
	}
	// An image committed from a fork is a child of the fork's snapshot,
	// which cannot be removed before it: children go in an earlier round.
	for round := 0; ; round++ {
		out, err := e.Docker("images", "-a", "-q", "--filter", "label="+label)
		if err != nil {
			errs = append(errs, err.Error())
			break
		}
		ids := uniq(strings.Fields(out))
		if len(ids) == 0 {
			break
		}
		var failed []string
		for _, id := range ids {
			if _, err := e.Docker("rmi", "-f", id); err != nil {
				failed = append(failed, err.Error())
			}
		}
		if len(failed) == len(ids) || round == 10 {
			errs = append(errs, failed...)
			break
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("removing what is labelled %s: %s", label, strings.Join(errs, "; "))
	}
	return nil
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// Container is a running container as the host sees it.
type Container struct {
	Name string
	// Pid is the host pid of its first process (the one that keeps it
	// running); MergedDir is its root folder on the host (overlay2).
	Pid       int
	MergedDir string
	// pidNS is its pid namespace (readlink of /proc/Pid/ns/pid).
	pidNS string
}

// Inspect returns the running container name.
func (e *Engine) Inspect(name string) (Container, error) {
	out, err := e.Docker("container", "inspect", "--format", "{{.State.Running}} {{.State.Pid}} {{.GraphDriver.Name}} {{.GraphDriver.Data.MergedDir}}", name)
	if err != nil {
		return Container{}, err
	}
	f := strings.Fields(out)
	if len(f) != 4 || f[0] != "true" {
		return Container{}, fmt.Errorf("container %s is not running (%q)", name, strings.TrimSpace(out))
	}
	if f[2] != "overlay2" {
		return Container{}, fmt.Errorf("container %s: storage driver %s: the tests read files through overlay2's merged folder", name, f[2])
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil || pid <= 0 {
		return Container{}, fmt.Errorf("container %s: pid %q", name, f[1])
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		return Container{}, fmt.Errorf("container %s: %v", name, err)
	}
	return Container{Name: name, Pid: pid, MergedDir: f[3], pidNS: ns}, nil
}

// Procs maps the pid (in the container's pid namespace) of every live
// process of the container but its first to its host pid. Zombies are
// left out.
func (c Container) Procs() map[int]int {
	out := map[int]int{}
	for _, pid := range proctest.Pids() {
		if pid == c.Pid {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || ns != c.pidNS {
			continue
		}
		if inner, ok := nsPid(pid); ok {
			out[inner] = pid
		}
	}
	return out
}

// nsPid reads the process's pid in its innermost pid namespace (the last
// NSpid field of /proc/PID/status); ok is false for a zombie or a process
// that is gone.
func nsPid(pid int) (int, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	inner, live := 0, true
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		switch {
		case k == "State" && len(f) > 0 && (f[0] == "Z" || f[0] == "X"):
			live = false
		case k == "NSpid" && len(f) > 0:
			inner, _ = strconv.Atoi(f[len(f)-1])
		}
	}
	return inner, live && inner > 0
}
