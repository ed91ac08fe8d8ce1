package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// The fake kubectl takes exactly the command lines a real kubectl takes
// for the subcommands it models, with kubectl's own flags (spf13/pflag:
// flags anywhere unless after "--"), and refuses the others with
// kubectl's words and exit code 1: "error: unknown flag: --x\nSee
// 'kubectl exec --help' for usage.", an exec without "--", a run without
// NAME or --image, delete's --now with --grace-period, and so on (from
// kubernetes/kubectl's pkg/cmd). A line a real kubectl would take but the
// fake does not model fails with exit 2 and a "fakecli:" message.

// kubeGlobal are kubectl's global flags (every subcommand takes them).
var kubeGlobal = []flag{
	{long: "namespace", short: "n", kind: stringFlag}, {long: "context", kind: stringFlag},
	{long: "kubeconfig", kind: stringFlag}, {long: "cluster", kind: stringFlag}, {long: "user", kind: stringFlag},
	{long: "server", short: "s", kind: stringFlag}, {long: "token", kind: stringFlag},
	{long: "request-timeout", kind: stringFlag}, {long: "as", kind: stringFlag}, {long: "as-group", kind: stringFlag},
	{long: "as-uid", kind: stringFlag}, {long: "certificate-authority", kind: stringFlag},
	{long: "client-certificate", kind: stringFlag}, {long: "client-key", kind: stringFlag},
	{long: "insecure-skip-tls-verify"}, {long: "tls-server-name", kind: stringFlag}, {long: "cache-dir", kind: stringFlag},
	{long: "match-server-version"}, {long: "warnings-as-errors"}, {long: "v", short: "v", kind: stringFlag},
	{long: "disable-compression"}, {long: "profile", kind: stringFlag}, {long: "profile-output", kind: stringFlag},
}

// kubeCommands are the flags of the subcommands the fake models.
var kubeCommands = map[string][]flag{
	"exec": {
		{long: "container", short: "c", kind: stringFlag}, {long: "stdin", short: "i"}, {long: "tty", short: "t"},
		{long: "quiet", short: "q"}, {long: "filename", short: "f", kind: stringFlag}, {long: "pod-running-timeout", kind: durationFlag},
	},
	"run": {
		{long: "image", kind: stringFlag}, {long: "image-pull-policy", kind: stringFlag}, {long: "rm"},
		{long: "env", kind: stringFlag}, {long: "port", kind: stringFlag}, {long: "labels", short: "l", kind: stringFlag},
		{long: "stdin", short: "i"}, {long: "tty", short: "t"}, {long: "attach"}, {long: "leave-stdin-open"},
		{long: "restart", kind: stringFlag}, {long: "command"}, {long: "expose"}, {long: "quiet", short: "q"},
		{long: "privileged"}, {long: "detach-keys", kind: stringFlag}, {long: "field-manager", kind: stringFlag},
		{long: "overrides", kind: stringFlag}, {long: "override-type", kind: stringFlag},
		{long: "dry-run", kind: optFlag, noOpt: "unchanged"}, {long: "annotations", kind: stringFlag},
		{long: "save-config"}, {long: "pod-running-timeout", kind: durationFlag}, {long: "output", short: "o", kind: stringFlag},
		{long: "template", kind: stringFlag}, {long: "allow-missing-template-keys"}, {long: "show-managed-fields"},
		{long: "record"}, {long: "filename", short: "f", kind: stringFlag}, {long: "kustomize", short: "k", kind: stringFlag},
		{long: "recursive", short: "R"}, {long: "force"}, {long: "grace-period", kind: intFlag},
		{long: "timeout", kind: durationFlag}, {long: "wait"}, {long: "cascade", kind: optFlag, noOpt: "background"},
	},
	"wait": {
		{long: "for", kind: stringFlag}, {long: "timeout", kind: durationFlag}, {long: "all"},
		{long: "all-namespaces", short: "A"}, {long: "selector", short: "l", kind: stringFlag},
		{long: "field-selector", kind: stringFlag}, {long: "filename", short: "f", kind: stringFlag},
		{long: "recursive", short: "R"}, {long: "local"}, {long: "output", short: "o", kind: stringFlag},
		{long: "template", kind: stringFlag}, {long: "allow-missing-template-keys"}, {long: "show-managed-fields"},
	},
	"get": {
		{long: "output", short: "o", kind: stringFlag}, {long: "watch", short: "w"}, {long: "watch-only"},
		{long: "ignore-not-found"}, {long: "selector", short: "l", kind: stringFlag}, {long: "all-namespaces", short: "A"},
		{long: "show-labels"}, {long: "no-headers"}, {long: "chunk-size", kind: intFlag},
		{long: "field-selector", kind: stringFlag}, {long: "label-columns", short: "L", kind: stringFlag},
		{long: "show-kind"}, {long: "sort-by", kind: stringFlag}, {long: "template", kind: stringFlag},
		{long: "filename", short: "f", kind: stringFlag}, {long: "recursive", short: "R"},
		{long: "kustomize", short: "k", kind: stringFlag}, {long: "raw", kind: stringFlag},
		{long: "subresource", kind: stringFlag}, {long: "output-watch-events"}, {long: "server-print"},
		{long: "allow-missing-template-keys"}, {long: "show-managed-fields"},
	},
	"delete": {
		{long: "all"}, {long: "all-namespaces", short: "A"}, {long: "cascade", kind: optFlag, noOpt: "background"},
		{long: "field-selector", kind: stringFlag}, {long: "filename", short: "f", kind: stringFlag}, {long: "force"},
		{long: "grace-period", kind: intFlag}, {long: "ignore-not-found"}, {long: "kustomize", short: "k", kind: stringFlag},
		{long: "now"}, {long: "output", short: "o", kind: stringFlag}, {long: "raw", kind: stringFlag},
		{long: "recursive", short: "R"}, {long: "selector", short: "l", kind: stringFlag},
		{long: "timeout", kind: durationFlag}, {long: "wait"}, {long: "interactive", short: "i"},
		{long: "dry-run", kind: optFlag, noOpt: "unchanged"},
	},
}

// kubeFail refuses a command line as kubectl does: "error: " and the
// message, exit 1.
func kubeFail(format string, args ...any) {
	refuse(1, "error: "+format, args...)
}

// kubeUsage fails as kubectl's usage errors do.
func kubeUsage(cmd, format string, args ...any) {
	kubeFail(format+"\nSee 'kubectl %s -h' for help and examples", append(args, cmd)...)
}

// notModelled fails for a line kubectl would take and the fake does not
// model.
func notModelled(format string, args ...any) {
	refuse(2, "fakecli: kubectl "+format+" is not modelled", args...)
}

// podID is the local sandbox id of a pod.
func podID(ns, pod string) string { return "k8s-" + ns + "." + pod }

// kubectl implements the kubectl subcommands.
func (c *cli) kubectl() {
	// The subcommand is the first word that is no flag nor a global
	// flag's value, as cobra finds it.
	a := c.args
	sub := -1
	for i := 0; i < len(a) && sub < 0; i++ {
		switch {
		case a[i] == "--":
			i = len(a)
		case !strings.HasPrefix(a[i], "-") || a[i] == "-":
			sub = i
		case !strings.Contains(a[i], "="):
			name := strings.TrimLeft(a[i], "-")
			for _, f := range kubeGlobal {
				if f.kind != boolFlag && (name == f.long || name == f.short) {
					i++
				}
			}
		}
	}
	if sub < 0 {
		refuse(2, "fakecli: kubectl without a subcommand is not modelled")
	}
	name := a[sub]
	flags, ok := kubeCommands[name]
	if !ok {
		switch name {
		case "cp", "logs", "attach", "describe", "apply", "create", "label", "annotate", "patch", "port-forward", "cluster-info", "version", "config":
			notModelled("%s", name)
		}
		kubeFail("unknown command %q for \"kubectl\"", name)
	}
	p, err := parse(append(append([]flag(nil), kubeGlobal...), flags...), append(append([]string(nil), a[:sub]...), a[sub+1:]...), true)
	if err != nil {
		kubeFail("%v\nSee 'kubectl %s --help' for usage.", err, name)
	}
	ns := p.str("namespace")
	if ns == "" {
		ns = "default"
	}
	switch name {
	case "exec":
		c.kubeExec(p, ns)
	case "run":
		c.kubeRun(p, ns)
	case "wait":
		c.kubeWait(p, ns)
	case "get":
		c.kubeGet(p, ns)
	case "delete":
		c.kubeDelete(p, ns)
	}
}

// podArg reads the pod a command names: "pod/NAME" (also pods/, po/) or,
// where a type comes first, "pod NAME".
func podArg(args []string, typeFirst bool) (string, bool) {
	if len(args) == 1 {
		if t, n, ok := strings.Cut(args[0], "/"); ok {
			return n, t == "pod" || t == "pods" || t == "po"
		}
		return args[0], !typeFirst
	}
	if len(args) == 2 && typeFirst && (args[0] == "pod" || args[0] == "pods" || args[0] == "po") {
		return args[1], true
	}
	return "", false
}

func notFound(pod string) { fail(1, "Error from server (NotFound): pods %q not found", pod) }

func (c *cli) kubeExec(p parsed, ns string) {
	before := p.args
	if p.dash >= 0 {
		before = p.args[:p.dash]
	}
	switch {
	case len(before) == 0:
		kubeUsage("exec", "expected 'exec (POD | TYPE/NAME) COMMAND [ARG1] [ARG2] ... [ARGN]'.\nPOD or TYPE/NAME is a required argument for the exec command")
	case len(before) > 1:
		kubeUsage("exec", "exec [POD] [COMMAND] is not supported anymore. Use exec [POD] -- [COMMAND] instead")
	}
	pod, ok := podArg(before, false)
	if !ok {
		notModelled("exec into %s", before[0])
	}
	command := p.args[len(before):]
	if len(command) == 0 {
		kubeFail("you must specify at least one command for the container")
	}
	id := podID(ns, pod)
	if !c.exists(id) {
		notFound(pod)
	}
	switch ctr := p.str("container"); {
	case ctr == "":
		if !p.boolean("quiet", false) {
			fmt.Fprintf(os.Stderr, "Defaulted container %q out of: %s, istio-proxy (init)\n", pod, pod)
		}
	case ctr != pod:
		// kubectl run names the pod's one container after the pod.
		fail(1, "Error from server (BadRequest): container %s is not valid for pod %s", ctr, pod)
	}
	if p.boolean("tty", false) {
		fmt.Fprintln(os.Stderr, "Unable to use a TTY - input is not a terminal or the right kind of file")
	}
	c.exec(id, "", nil, command, p.boolean("stdin", false), true)
}

func (c *cli) kubeRun(p parsed, ns string) {
	if len(p.args) == 0 || p.dash == 0 {
		kubeFail("NAME is required for run")
	}
	if !p.has("image") {
		kubeFail("required flag(s) \"image\" not set")
	}
	name, img := p.args[0], p.str("image")
	if img == "" {
		kubeFail("--image is required")
	}
	last := img[strings.LastIndexByte(img, '/')+1:]
	repo := img[:len(img)-len(last)] + last[:strings.IndexAny(last+":", ":@")]
	if repo == "" || strings.ContainsAny(img, " \t\n") || strings.ToLower(repo) != repo {
		kubeFail("invalid image name %q: invalid reference format", img)
	}
	interactive, tty, attach := p.boolean("stdin", false), p.boolean("tty", false), p.boolean("attach", false)
	attach = attach || interactive && !p.has("attach")
	switch {
	case tty && !interactive:
		kubeFail("-i/--stdin is required for containers with -t/--tty=true")
	case p.boolean("rm", false) && !attach:
		kubeFail("--rm should only be used for attached containers")
	case attach:
		notModelled("run --attach, -i or -t")
	}
	switch r := p.str("restart"); r {
	case "", "Always", "OnFailure", "Never":
	default:
		kubeFail("invalid restart policy: %s, valid values are: Always, OnFailure, Never", r)
	}
	if l := p.str("labels"); l != "" {
		for _, spec := range strings.Split(l, ",") {
			kv := strings.Split(spec, "=")
			if len(kv) != 2 {
				kubeFail("unexpected label spec: %s", spec)
			}
			if kv[0] == "" {
				kubeFail("unexpected empty label key")
			}
		}
	}
	for _, e := range p.values["env"] {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			kubeFail("invalid env: %v", e)
		}
	}
	switch t := p.str("override-type"); t {
	case "", "merge", "json", "strategic":
	default:
		kubeFail("invalid override type: %v", t)
	}
	if o := p.str("overrides"); o != "" && !json.Valid([]byte(o)) {
		kubeFail("Invalid JSON Patch")
	}
	if d := p.str("dry-run"); d != "" && d != "none" {
		notModelled("run --dry-run")
	}
	if err := checkPodName(name); err != "" {
		fail(1, "The Pod %q is invalid: metadata.name: Invalid value: %q: %s", name, name, err)
	}
	id := podID(ns, name)
	if c.exists(id) {
		fail(1, "Error from server (AlreadyExists): pods %q already exists", name)
	}
	if _, err := c.store.Create(context.Background(), id); err != nil {
		fail(1, "error: %v", err)
	}
	fmt.Printf("pod/%s created\n", name)
}

// checkPodName is the API server's check of a pod's name (a DNS-1123
// subdomain); "" when it passes.
func checkPodName(n string) string {
	ok := n != "" && len(n) <= 253
	for i, r := range n {
		alnum := r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		ok = ok && (alnum || r == '-' || r == '.') && (alnum || i > 0 && i < len(n)-1)
	}
	if ok {
		return ""
	}
	return "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
}

func (c *cli) kubeWait(p parsed, ns string) {
	cond := p.str("for")
	name, value, known := "", "true", false
	switch {
	case strings.ToLower(cond) == "delete":
		notModelled("wait --for=delete")
	case strings.HasPrefix(cond, "condition="):
		name = strings.TrimPrefix(cond, "condition=")
		if n, v, ok := strings.Cut(name, "="); ok {
			name, value = n, v
		}
		known = true
	case strings.HasPrefix(cond, "jsonpath="):
		notModelled("wait --for=jsonpath=...")
	}
	if !known {
		kubeFail("unrecognized condition: %q", cond)
	}
	pod, ok := podArg(p.args, true)
	if !ok {
		notModelled("wait for %q", strings.Join(p.args, " "))
	}
	if !c.exists(podID(ns, pod)) {
		notFound(pod)
	}
	switch name {
	case "Ready", "ContainersReady", "Initialized", "PodScheduled":
		if strings.EqualFold(value, "true") {
			fmt.Printf("pod/%s condition met\n", pod)
			return
		}
	}
	fail(1, "error: timed out waiting for the condition on pods/%s", pod)
}

func (c *cli) kubeGet(p parsed, ns string) {
	pod, ok := podArg(p.args, true)
	if !ok {
		notModelled("get %q", strings.Join(p.args, " "))
	}
	if !c.exists(podID(ns, pod)) {
		if p.boolean("ignore-not-found", false) {
			return
		}
		notFound(pod)
	}
	out := p.str("output")
	format, tmpl, _ := strings.Cut(out, "=")
	switch format {
	case "":
		fmt.Printf("NAME\tREADY\tSTATUS\tRESTARTS\tAGE\n%s\t1/1\tRunning\t0\t1m\n", pod)
	case "name":
		fmt.Printf("pod/%s\n", pod)
	case "jsonpath":
		if tmpl == "" {
			tmpl = p.str("template")
		}
		switch tmpl {
		case "":
			kubeFail("template format specified but no template given")
		case "{.status.phase}":
			fmt.Print("Running")
		case "{.metadata.name}":
			fmt.Print(pod)
		case "{.metadata.namespace}":
			fmt.Print(ns)
		default:
			notModelled("get -o jsonpath=%s", tmpl)
		}
	case "custom-columns", "custom-columns-file", "go-template", "go-template-file", "json", "jsonpath-as-json", "jsonpath-file", "template", "templatefile", "wide", "yaml":
		notModelled("get -o %s", format)
	default:
		kubeFail("unable to match a printer suitable for the output format %q, allowed formats are: custom-columns,custom-columns-file,go-template,go-template-file,json,jsonpath,jsonpath-as-json,jsonpath-file,name,template,templatefile,wide,yaml", out)
	}
}

func (c *cli) kubeDelete(p parsed, ns string) {
	grace := -1
	if p.has("grace-period") {
		fmt.Sscan(p.str("grace-period"), &grace)
	}
	force := p.boolean("force", false)
	if p.boolean("now", false) {
		if grace != -1 {
			kubeFail("--now and --grace-period cannot be specified together")
		}
		grace = 1
	}
	if grace == 0 && !force {
		grace = 1
	}
	if force && grace < 0 {
		grace = 0
	}
	if o := p.str("output"); o != "" && o != "name" {
		kubeFail("unexpected -o output mode: %v. We only support '-o name'", o)
	}
	if force && grace > 0 {
		kubeFail("--force and --grace-period greater than 0 cannot be specified together")
	}
	if d := p.str("dry-run"); d != "" && d != "none" {
		notModelled("delete --dry-run")
	}
	pod, ok := podArg(p.args, true)
	if !ok {
		notModelled("delete %q", strings.Join(p.args, " "))
	}
	if grace == 0 {
		fmt.Fprintln(os.Stderr, "Warning: Immediate deletion does not wait for confirmation that the running resource has been terminated. The resource may continue to run on the cluster indefinitely.")
	}
	id := podID(ns, pod)
	if !c.exists(id) {
		if p.boolean("ignore-not-found", false) {
			return
		}
		notFound(pod)
	}
	c.remove(id)
	switch {
	case p.str("output") == "name":
		fmt.Printf("pod/%s\n", pod)
	case grace == 0:
		fmt.Printf("pod %q force deleted\n", pod)
	default:
		fmt.Printf("pod %q deleted\n", pod)
	}
}
