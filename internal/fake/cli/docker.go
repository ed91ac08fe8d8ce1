package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

// dockerFlagError fails as the docker client does on a bad command line.
func dockerFlagError(cmd string, err error) {
	refuse(125, "%v\nSee 'docker %s --help'.", err, cmd)
}

// docker implements the docker subcommands.
func (c *cli) docker() {
	a := c.args
	if len(a) == 0 {
		refuse(2, "fakecli: docker without a subcommand is not modelled")
	}
	switch {
	case a[0] == "exec":
		c.dockerExec(a[1:])
	case a[0] == "run":
		c.dockerRun(a[1:])
	case a[0] == "commit":
		c.dockerCommit(a[1:])
	case a[0] == "container" && len(a) == 5 && a[1] == "inspect" && a[2] == "-f":
		if !c.exists(a[4]) {
			fail(1, "Error response from daemon: No such container: %s", a[4])
		}
		fmt.Println("true")
	case a[0] == "image" && len(a) > 1 && a[1] == "inspect":
		c.dockerImageInspect(a[2:])
	case a[0] == "images" || a[0] == "image" && len(a) > 1 && (a[1] == "ls" || a[1] == "list"):
		if a[0] == "image" {
			a = a[1:]
		}
		c.dockerImages(a[1:])
	case a[0] == "rm" && len(a) == 3 && a[1] == "-f":
		name := a[2]
		if err := c.locked(func(st *state) error {
			if !c.exists(name) {
				fail(1, "Error response from daemon: No such container: %s", name)
			}
			c.remove(name)
			delete(st.Containers, name)
			return nil
		}); err != nil {
			fail(1, "Error response from daemon: %v", err)
		}
		fmt.Println(name)
	case a[0] == "rmi":
		c.dockerRmi(a[1:])
	default:
		refuse(2, "fakecli: docker %s is not modelled", strings.Join(a, " "))
	}
}

func (c *cli) dockerExec(a []string) {
	p, err := parse([]flag{
		{long: "interactive", short: "i"}, {long: "tty", short: "t"}, {long: "detach", short: "d"},
		{long: "user", short: "u", kind: stringFlag}, {long: "workdir", short: "w", kind: stringFlag},
		{long: "env", short: "e", kind: stringFlag}, {long: "privileged"},
	}, a, false)
	if err != nil {
		dockerFlagError("exec", err)
	}
	if len(p.args) < 2 {
		refuse(1, "\"docker exec\" requires at least 2 arguments.\nSee 'docker exec --help'.")
	}
	if p.has("tty") || p.has("detach") {
		refuse(2, "fakecli: docker exec -t and -d are not modelled")
	}
	env := map[string]string{}
	for _, kv := range p.values["env"] {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	id := p.args[0]
	if !c.exists(id) {
		fail(1, "Error response from daemon: No such container: %s", id)
	}
	c.exec(id, p.str("workdir"), env, p.args[1:], p.boolean("interactive", false), false)
}

func (c *cli) dockerRun(a []string) {
	p, err := parse([]flag{
		{long: "detach", short: "d"}, {long: "interactive", short: "i"}, {long: "tty", short: "t"}, {long: "rm"},
		{long: "name", kind: stringFlag}, {long: "label", short: "l", kind: stringFlag},
		{long: "network", kind: stringFlag}, {long: "memory", short: "m", kind: stringFlag}, {long: "cpus", kind: stringFlag},
		{long: "env", short: "e", kind: stringFlag}, {long: "volume", short: "v", kind: stringFlag},
		{long: "workdir", short: "w", kind: stringFlag}, {long: "user", short: "u", kind: stringFlag},
		{long: "entrypoint", kind: stringFlag}, {long: "platform", kind: stringFlag}, {long: "hostname", kind: stringFlag},
		{long: "cap-add", kind: stringFlag}, {long: "cap-drop", kind: stringFlag}, {long: "init"},
	}, a, false)
	if err != nil {
		dockerFlagError("run", err)
	}
	if len(p.args) < 1 {
		refuse(125, "\"docker run\" requires at least 1 argument.\nSee 'docker run --help'.")
	}
	name, ref := p.str("name"), p.args[0]
	if name == "" || !p.has("detach") {
		refuse(2, "fakecli: docker run needs -d and --name")
	}
	labels := map[string]string{}
	for _, kv := range p.values["label"] {
		k, v, _ := strings.Cut(kv, "=")
		labels[k] = v
	}
	if err := c.locked(func(st *state) error {
		if c.exists(name) {
			fail(125, "docker: Error response from daemon: Conflict. The container name \"/%s\" is already in use by container \"%s\". You have to remove (or rename) that container to be able to reuse that name.", name, name)
		}
		ct := &container{Image: ref, Labels: labels}
		var err error
		if id, ok := st.resolve(ref); ok {
			ct.Image = id
			ct.Labels = maps.Clone(st.Images[id].Labels)
			maps.Copy(ct.Labels, labels)
			_, err = c.store.Fork(context.Background(), imageSnapshot(id), name)
		} else if strings.HasPrefix(ref, localRepo()) || strings.HasPrefix(ref, "sha256:") {
			// Made here by commit, never pulled.
			fail(125, "Unable to find image '%s' locally\ndocker: Error response from daemon: pull access denied for %s, repository does not exist or may require 'docker login'.", ref, ref)
		} else {
			_, err = c.store.Create(context.Background(), name)
		}
		if err != nil {
			fail(125, "docker: Error response from daemon: %v", err)
		}
		st.Containers[name] = ct
		return nil
	}); err != nil {
		fail(125, "docker: Error response from daemon: %v", err)
	}
	fmt.Println(name)
}

// dockerCommit commits a container to a new image, labelled with the
// container's labels and those of LABEL changes; a name another image had
// is taken from it (which leaves that one untagged, dangling).
func (c *cli) dockerCommit(a []string) {
	p, err := parse([]flag{
		{long: "author", short: "a", kind: stringFlag}, {long: "change", short: "c", kind: stringFlag},
		{long: "message", short: "m", kind: stringFlag}, {long: "pause", short: "p"},
	}, a, true)
	if err != nil {
		dockerFlagError("commit", err)
	}
	if len(p.args) < 1 || len(p.args) > 2 {
		refuse(1, "\"docker commit\" requires at least 1 and at most 2 arguments.\nSee 'docker commit --help'.")
	}
	labels := map[string]string{}
	for _, ch := range p.values["change"] {
		instr, rest, _ := strings.Cut(strings.TrimSpace(ch), " ")
		switch strings.ToUpper(instr) {
		case "LABEL":
			for _, kv := range strings.Fields(rest) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					fail(1, "Error response from daemon: LABEL requires at least one argument")
				}
				labels[k] = strings.Trim(v, `"`)
			}
		case "ENV", "CMD", "ENTRYPOINT", "EXPOSE", "ONBUILD", "USER", "VOLUME", "WORKDIR", "STOPSIGNAL", "HEALTHCHECK":
		default:
			fail(1, "Error response from daemon: %s is not a valid change command", instr)
		}
	}
	name := p.args[0]
	id := newImageID()
	if err := c.locked(func(st *state) error {
		if !c.exists(name) {
			fail(1, "Error response from daemon: No such container: %s", name)
		}
		im := &image{Labels: map[string]string{}}
		if ct := st.Containers[name]; ct != nil {
			maps.Copy(im.Labels, ct.Labels)
		}
		maps.Copy(im.Labels, labels)
		if err := c.store.Snapshot(context.Background(), name, imageSnapshot(id)); err != nil {
			return err
		}
		if len(p.args) == 2 {
			ref := normalRef(p.args[1])
			st.untag(ref)
			im.Tags = []string{ref}
		}
		st.Images[id] = im
		return nil
	}); err != nil {
		fail(1, "Error response from daemon: %v", err)
	}
	fmt.Println(id)
}

// dockerImages lists images: -q ids only (-a and --no-trunc as docker's),
// filtered by dangling=true|false and label=KEY[=VALUE].
func (c *cli) dockerImages(a []string) {
	p, err := parse([]flag{
		{long: "all", short: "a"}, {long: "quiet", short: "q"}, {long: "no-trunc"}, {long: "digests"},
		{long: "filter", short: "f", kind: stringFlag}, {long: "format", kind: stringFlag},
	}, a, true)
	if err != nil {
		dockerFlagError("images", err)
	}
	if len(p.args) > 0 || p.has("format") || p.has("digests") {
		refuse(2, "fakecli: docker images takes -a, -q, --no-trunc and --filter only")
	}
	type match func(im *image) bool
	var filters []match
	for _, f := range p.values["filter"] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "dangling":
			if v != "true" && v != "false" {
				fail(1, "Error response from daemon: Invalid filter 'dangling=%s'", v)
			}
			want := v == "true"
			filters = append(filters, func(im *image) bool { return (len(im.Tags) == 0) == want })
		case "label":
			lk, lv, withValue := strings.Cut(v, "=")
			filters = append(filters, func(im *image) bool {
				got, ok := im.Labels[lk]
				return ok && (!withValue || got == lv)
			})
		default:
			refuse(2, "fakecli: docker images --filter %s is not modelled", k)
		}
	}
	var rows []string
	_ = c.locked(func(st *state) error {
		for _, id := range st.ids() {
			im := st.Images[id]
			keep := true
			for _, f := range filters {
				keep = keep && f(im)
			}
			if !keep {
				continue
			}
			shown := id
			if !p.has("no-trunc") {
				shown = strings.TrimPrefix(id, "sha256:")[:12]
			}
			if p.has("quiet") {
				rows = append(rows, shown)
				continue
			}
			tags := im.Tags
			if len(tags) == 0 {
				tags = []string{"<none>:<none>"}
			}
			for _, t := range tags {
				i := strings.LastIndexByte(t, ':')
				rows = append(rows, fmt.Sprintf("%s\t%s\t%s", t[:i], t[i+1:], shown))
			}
		}
		return nil
	})
	if !p.has("quiet") {
		fmt.Println("REPOSITORY\tTAG\tIMAGE ID")
	}
	for _, r := range rows {
		fmt.Println(r)
	}
}

func (c *cli) dockerImageInspect(a []string) {
	p, err := parse([]flag{{long: "format", short: "f", kind: stringFlag}}, a, true)
	if err != nil {
		dockerFlagError("image inspect", err)
	}
	if len(p.args) == 0 {
		refuse(1, "\"docker image inspect\" requires at least 1 argument.\nSee 'docker image inspect --help'.")
	}
	if f := p.str("format"); f != "" && f != "{{.Id}}" {
		refuse(2, "fakecli: docker image inspect --format %s is not modelled", f)
	}
	var out []map[string]any
	failed := false
	_ = c.locked(func(st *state) error {
		for _, ref := range p.args {
			id, ok := st.resolve(ref)
			if !ok {
				fmt.Fprintf(os.Stderr, "Error response from daemon: No such image: %s\n", ref)
				failed = true
				continue
			}
			if p.has("format") {
				fmt.Println(id)
				continue
			}
			out = append(out, map[string]any{"Id": id, "RepoTags": st.Images[id].Tags, "Config": map[string]any{"Labels": st.Images[id].Labels}})
		}
		return nil
	})
	if !p.has("format") {
		data, _ := json.MarshalIndent(out, "", "    ")
		fmt.Println(string(data))
	}
	if failed {
		os.Exit(1)
	}
}

// dockerRmi removes images as docker does: a reference is untagged, and
// the image deleted once it has no tag left; an image a container uses is
// only untagged with -f and refused without; an id with several tags
// needs -f.
func (c *cli) dockerRmi(a []string) {
	p, err := parse([]flag{{long: "force", short: "f"}, {long: "no-prune"}}, a, true)
	if err != nil {
		dockerFlagError("rmi", err)
	}
	if len(p.args) == 0 {
		refuse(1, "\"docker rmi\" requires at least 1 argument.\nSee 'docker rmi --help'.")
	}
	force := p.boolean("force", false)
	failed := false
	errf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "Error response from daemon: "+format+"\n", args...)
		failed = true
	}
	if err := c.locked(func(st *state) error {
		for _, ref := range p.args {
			id, ok := st.resolve(ref)
			if !ok {
				errf("No such image: %s", ref)
				continue
			}
			im := st.Images[id]
			byID := !slices.Contains(im.Tags, normalRef(ref))
			user, used := st.user(id)
			switch {
			case byID && used:
				errf("conflict: unable to delete %s (cannot be forced) - image is being used by running container %s", strings.TrimPrefix(id, "sha256:")[:12], user)
				continue
			case byID && len(im.Tags) > 1 && !force:
				errf("conflict: unable to delete %s (must be forced) - image is referenced in multiple repositories", strings.TrimPrefix(id, "sha256:")[:12])
				continue
			case byID:
				for _, t := range im.Tags {
					fmt.Println("Untagged: " + t)
				}
				im.Tags = nil
			case used && len(im.Tags) == 1 && !force:
				errf("conflict: unable to remove repository reference %q (must force) - container %s is using its referenced image %s", ref, user, strings.TrimPrefix(id, "sha256:")[:12])
				continue
			default:
				st.untag(normalRef(ref))
				fmt.Println("Untagged: " + normalRef(ref))
			}
			if len(im.Tags) == 0 && !used {
				if err := c.store.RemoveSnapshot(context.Background(), imageSnapshot(id)); err != nil {
					return err
				}
				delete(st.Images, id)
				fmt.Println("Deleted: " + id)
			}
		}
		return nil
	}); err != nil {
		fail(1, "Error response from daemon: %v", err)
	}
	if failed {
		os.Exit(1)
	}
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
