// Command fakecli is a fake `docker` and `kubectl` (which one is decided by
// the name it is run under): the subcommands the docker and kubectl
// sandbox backends use, run for real on this machine. A container or pod
// is a folder (a local sandbox under $FAKECLI_BASE) that every command
// run in it sees at one fixed path ($FAKECLI_MOUNT, default /sandbox)
// through a mount namespace of its own, as root; a docker snapshot image
// is a copy of such a folder. Removing a container or pod kills every
// process running in it.
//
// The messages and exit codes of failures are the real clients' ("Error
// response from daemon: No such container: NAME", `Error from server
// (NotFound): pods "NAME" not found`). With $FAKECLI_BASE/down present,
// every call fails as when the daemon or API server cannot be reached.
//
// docker: exec [-i] [-u USER] [-w DIR] [-e K=V]... CONTAINER CMD...;
// run -d --name NAME [flags] IMAGE [CMD...]; commit CONTAINER REF;
// container inspect -f FORMAT NAME; rm -f NAME; rmi [-f] REF;
// image inspect REF.
//
// kubectl (global --context, --kubeconfig, -n/--namespace anywhere):
// exec -i POD [-c C] -- CMD...; run NAME --image=IMG [flags] [--command]
// -- CMD...; wait --for=condition=Ready pod/NAME [--timeout=D];
// get pod NAME -o jsonpath={.status.phase}; delete pod NAME [flags].
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/test/fakeexecd"
)

func main() {
	base := os.Getenv("FAKECLI_BASE")
	if base == "" || !filepath.IsAbs(base) {
		fail(2, "fakecli: FAKECLI_BASE must name an absolute folder")
	}
	mp := os.Getenv("FAKECLI_MOUNT")
	if mp == "" {
		mp = local.DefaultMountPoint
	}
	store, err := local.New(base, local.Options{Isolation: local.IsolationNamespace, MountPoint: mp})
	if err != nil {
		fail(2, "fakecli: %v", err)
	}
	c := &cli{store: store, base: base, args: os.Args[1:]}
	name := filepath.Base(os.Args[0])
	down := false
	if _, err := os.Stat(filepath.Join(base, "down")); err == nil {
		down = true
	}
	switch name {
	case "docker":
		if down {
			fail(1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?")
		}
		c.docker()
	case "kubectl":
		if down {
			fail(1, "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?\nUnable to connect to the server: dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		c.kubectl()
	default:
		fail(2, "fakecli: run me as docker or kubectl, not %s", name)
	}
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(code)
}

type cli struct {
	store *local.Backend
	base  string
	args  []string
}

// exec runs argv in the sandbox id, in a mount namespace of its own in
// which the sandbox's folder is bind-mounted at the mount point, and exits
// with its exit code. Its output is relayed as it comes, and its input
// passed on; it runs in a session of its own, so, as with the real
// clients, killing this process does not kill what it started.
func (c *cli) exec(id, dir string, env map[string]string, argv []string, kube bool) {
	if dir == "" {
		dir = "/"
	}
	mp := c.store.MountPoint()
	script := fmt.Sprintf("mount --bind %s %s || exit 125\ncd -- %s || exit 126\nexec \"$@\"",
		sandbox.Quote(c.store.HostPath(id)), sandbox.Quote(mp), sandbox.Quote(dir))
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh"}, argv...)...)
	cmd.Dir = "/"
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	cmd.Env = []string{"PATH=" + path, "LANG=C.UTF-8", "HOME=" + mp + "/home"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// Wrapped, so that the output is relayed through pipes of this
	// process (not handed down as its own descriptors).
	cmd.Stdin = struct{ io.Reader }{os.Stdin}
	cmd.Stdout = struct{ io.Writer }{os.Stdout}
	cmd.Stderr = struct{ io.Writer }{os.Stderr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		fail(126, "fakecli: exec in %s: %v", id, err)
	}
	_ = cmd.Wait()
	code := -1
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled():
			code = 128 + int(ws.Signal())
		case ws.Exited():
			code = ws.ExitStatus()
		}
	}
	if kube && code != 0 {
		fmt.Fprintf(os.Stderr, "command terminated with exit code %d\n", code)
	}
	os.Exit(code)
}

func (c *cli) exists(id string) bool {
	fi, err := os.Stat(c.store.HostPath(id))
	return err == nil && fi.IsDir()
}

// remove removes the sandbox's folder (renamed away first, so it is gone
// at once) and kills every process running in it.
func (c *cli) remove(id string) {
	fi, err := os.Stat(c.store.HostPath(id))
	if err != nil {
		fail(1, "fakecli: %v", err)
	}
	gone := filepath.Join(c.base, ".removing-"+id+"-"+strconv.Itoa(os.Getpid()))
	if err := os.Rename(c.store.HostPath(id), gone); err != nil {
		fail(1, "fakecli: %v", err)
	}
	fakeexecd.KillInFolder(fi, c.store.MountPoint())
	if err := os.RemoveAll(gone); err != nil {
		fail(1, "fakecli: %v", err)
	}
}

// imageID is the local snapshot id of a docker image reference.
func imageID(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return "img-" + hex.EncodeToString(sum[:16])
}

// docker implements the docker subcommands.
func (c *cli) docker() {
	a := c.args
	if len(a) == 0 {
		fail(1, "docker: no command")
	}
	switch {
	case a[0] == "exec":
		c.dockerExec(a[1:])
	case a[0] == "run":
		c.dockerRun(a[1:])
	case a[0] == "commit" && len(a) == 3:
		if !c.exists(a[1]) {
			fail(1, "Error response from daemon: No such container: %s", a[1])
		}
		id := imageID(a[2])
		if c.store.HasSnapshot(id) {
			_ = c.store.RemoveSnapshot(context.Background(), id)
		}
		if err := c.store.Snapshot(context.Background(), a[1], id); err != nil {
			fail(1, "Error response from daemon: %v", err)
		}
		fmt.Println("sha256:" + strings.TrimPrefix(id, "img-"))
	case a[0] == "container" && len(a) == 5 && a[1] == "inspect" && a[2] == "-f":
		if !c.exists(a[4]) {
			fail(1, "Error response from daemon: No such container: %s", a[4])
		}
		fmt.Println("true")
	case a[0] == "image" && len(a) == 3 && a[1] == "inspect":
		if !c.store.HasSnapshot(imageID(a[2])) {
			fail(1, "Error response from daemon: No such image: %s", a[2])
		}
		fmt.Println("[{}]")
	case a[0] == "rm" && len(a) == 3 && a[1] == "-f":
		if !c.exists(a[2]) {
			fail(1, "Error response from daemon: No such container: %s", a[2])
		}
		c.remove(a[2])
		fmt.Println(a[2])
	case a[0] == "rmi":
		ref := a[len(a)-1]
		if !c.store.HasSnapshot(imageID(ref)) {
			fail(1, "Error response from daemon: No such image: %s", ref)
		}
		if err := c.store.RemoveSnapshot(context.Background(), imageID(ref)); err != nil {
			fail(1, "Error response from daemon: %v", err)
		}
		fmt.Println("Untagged: " + ref)
	default:
		fail(1, "docker: fakecli does not know %q", strings.Join(a, " "))
	}
}

func (c *cli) dockerExec(a []string) {
	env := map[string]string{}
	dir := ""
	i := 0
	for ; i < len(a) && strings.HasPrefix(a[i], "-"); i++ {
		switch a[i] {
		case "-i", "--interactive":
		case "-u", "--user":
			i++
		case "-w", "--workdir":
			i++
			dir = a[i]
		case "-e", "--env":
			i++
			k, v, _ := strings.Cut(a[i], "=")
			env[k] = v
		default:
			fail(1, "unknown flag: %s", a[i])
		}
	}
	if i+1 >= len(a) {
		fail(1, "\"docker exec\" requires at least 2 arguments.")
	}
	id := a[i]
	if !c.exists(id) {
		fail(1, "Error response from daemon: No such container: %s", id)
	}
	c.exec(id, dir, env, a[i+1:], false)
}

func (c *cli) dockerRun(a []string) {
	name := ""
	withValue := map[string]bool{"--name": true, "--label": true, "-l": true, "--network": true, "--memory": true, "-m": true,
		"--cpus": true, "-e": true, "--env": true, "-v": true, "--volume": true, "-w": true, "--workdir": true,
		"-u": true, "--user": true, "--entrypoint": true, "--platform": true, "--hostname": true}
	i := 0
	for ; i < len(a) && strings.HasPrefix(a[i], "-"); i++ {
		flag, _, hasValue := strings.Cut(a[i], "=")
		if withValue[flag] && !hasValue {
			i++
			if flag == "--name" {
				name = a[i]
			}
		}
	}
	if i >= len(a) {
		fail(125, "\"docker run\" requires at least 1 argument.")
	}
	image := a[i]
	if name == "" {
		fail(125, "docker: fakecli needs --name")
	}
	if c.exists(name) {
		fail(125, "docker: Error response from daemon: Conflict. The container name \"/%s\" is already in use by container \"%s\". You have to remove (or rename) that container to be able to reuse that name.", name, name)
	}
	var err error
	switch {
	case c.store.HasSnapshot(imageID(image)):
		_, err = c.store.Fork(context.Background(), imageID(image), name)
	case strings.HasPrefix(image, localRepo()):
		// Made here by commit, never pulled.
		fail(125, "Unable to find image '%s' locally\ndocker: Error response from daemon: pull access denied for %s, repository does not exist or may require 'docker login'.", image, image)
	default:
		_, err = c.store.Create(context.Background(), name)
	}
	if err != nil {
		fail(125, "docker: Error response from daemon: %v", err)
	}
	fmt.Println(name)
}

// localRepo is the repository of images that exist only once committed
// ($FAKECLI_LOCAL_REPO, default ngharness-snapshot): any other image is
// "pulled" as an empty container.
func localRepo() string {
	if r := os.Getenv("FAKECLI_LOCAL_REPO"); r != "" {
		return r
	}
	return "ngharness-snapshot"
}

// podID is the local sandbox id of a pod.
func podID(ns, pod string) string { return "k8s-" + ns + "." + pod }

// kubectl implements the kubectl subcommands.
func (c *cli) kubectl() {
	ns := "default"
	var pos []string
	var after []string
	flags := map[string]string{}
	a := c.args
	for i := 0; i < len(a); i++ {
		switch {
		case a[i] == "--":
			after = a[i+1:]
			i = len(a)
		case a[i] == "-n" || a[i] == "--namespace":
			i++
			ns = a[i]
		case strings.HasPrefix(a[i], "--namespace="):
			ns = strings.TrimPrefix(a[i], "--namespace=")
		case a[i] == "--context" || a[i] == "--kubeconfig" || a[i] == "-c" || a[i] == "-o" || a[i] == "--image":
			i++
			flags[a[i-1]] = a[i]
		case strings.HasPrefix(a[i], "-"):
			k, v, _ := strings.Cut(a[i], "=")
			flags[k] = v
		default:
			pos = append(pos, a[i])
		}
	}
	if len(pos) == 0 {
		fail(1, "kubectl: no command")
	}
	notFound := func(pod string) { fail(1, "Error from server (NotFound): pods %q not found", pod) }
	switch {
	case pos[0] == "exec" && len(pos) == 2:
		id := podID(ns, pos[1])
		if !c.exists(id) {
			notFound(pos[1])
		}
		if len(after) == 0 {
			fail(1, "error: you must specify at least one command for the container")
		}
		if flags["-c"] == "" {
			fmt.Fprintf(os.Stderr, "Defaulted container %q out of: %s, istio-proxy (init)\n", pos[1], pos[1])
		}
		c.exec(id, "", nil, after, true)
	case pos[0] == "run" && len(pos) == 2:
		id := podID(ns, pos[1])
		if c.exists(id) {
			fail(1, "Error from server (AlreadyExists): pods %q already exists", pos[1])
		}
		if flags["--image"] == "" {
			fail(1, "error: --image is required")
		}
		if _, err := c.store.Create(context.Background(), id); err != nil {
			fail(1, "error: %v", err)
		}
		fmt.Printf("pod/%s created\n", pos[1])
	case pos[0] == "wait" && len(pos) == 2 && strings.HasPrefix(pos[1], "pod/"):
		pod := strings.TrimPrefix(pos[1], "pod/")
		if !c.exists(podID(ns, pod)) {
			notFound(pod)
		}
		fmt.Printf("pod/%s condition met\n", pod)
	case pos[0] == "get" && len(pos) == 3 && pos[1] == "pod":
		if !c.exists(podID(ns, pos[2])) {
			notFound(pos[2])
		}
		fmt.Print("Running")
	case pos[0] == "delete" && len(pos) == 3 && pos[1] == "pod":
		id := podID(ns, pos[2])
		if !c.exists(id) {
			if _, ok := flags["--ignore-not-found"]; ok {
				return
			}
			notFound(pos[2])
		}
		c.remove(id)
		fmt.Printf("pod %q force deleted\n", pos[2])
	default:
		fail(1, "kubectl: fakecli does not know %q", strings.Join(c.args, " "))
	}
}
