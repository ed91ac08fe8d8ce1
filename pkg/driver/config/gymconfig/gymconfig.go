// Package gymconfig reads `ngdriver serve`'s settings from a NeMo Gym
// config: the whole resolved config Gym's launcher hands every server in
// NEMO_GYM_CONFIG_DICT (YAML; JSON is accepted too), or the same document
// in a file. The server's own entry is the top-level key named by
// NEMO_GYM_CONFIG_PATH (or given explicitly):
//
//	<instance>:
//	  responses_api_agents:
//	    <agent type>:
//	      entrypoint: app.py
//	      host: 127.0.0.1            # Gym's launcher fills host and port
//	      port: 12345
//	      resources_server: {type: resources_servers, name: <instance>}
//	      model_server: {type: responses_api_models, name: <instance>}
//	      ngdriver: {...}            # our settings, as in examples/ngdriver.yaml
//	checkpoint: {enabled: true, control_auth_token: ..., lease_grace_seconds: 600}
//
// A reference {type, name} resolves as Gym's ServerClient resolves it: to
// http://<host>:<port> of the named entry's single server config. The
// listen address comes from host and port, the owner URL from
// resources_server, the name from the instance, the control token and
// lease grace from the global checkpoint block, and model_server's URL
// becomes the model_url of the selected adapter's section (when its
// harness calls a model server), and the keys of Gym's own agent for the
// selected adapter's harness that have an equivalent (its row's
// config.AdapterKeys.Gym: Gym's OpenCode agent's for opencode) fill that
// section.
// The `ngdriver` block is strict (an unknown key is an error naming it);
// Gym's own keys that ngdriver does not use are ignored and reported in
// Settings.Ignored.
package gymconfig

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ngharness/ngharness/pkg/driver/config"
)

// The environment variables Gym's launcher sets for every server process.
const (
	// EnvConfigDict holds the whole resolved Gym config as YAML.
	EnvConfigDict = "NEMO_GYM_CONFIG_DICT"
	// EnvConfigPath names this server's top-level entry in it.
	EnvConfigPath = "NEMO_GYM_CONFIG_PATH"
)

// Gym's server types, as the keys under an instance and the type of a
// server reference.
const (
	EnvironmentType = "environment_servers"
	AgentType       = "responses_api_agents"
	ResourcesType   = "resources_servers"
	ModelType       = "responses_api_models"
)

// ServerTypes are the server types Gym's checkpoint coordinator walks a
// config for (nemo_gym/_checkpoint/coordination.py _SERVER_TYPES at
// 011c3386d691).
var ServerTypes = []string{EnvironmentType, ModelType, AgentType, ResourcesType}

// OurKey is the key of ngdriver's own block in the agent's stanza.
const OurKey = "ngdriver"

// DefaultLeaseGrace is Gym's default lease_grace_seconds.
const DefaultLeaseGrace = 600 * time.Second

// Ref is a resolved server reference.
type Ref struct {
	// Type and Name are the reference as written ({type, name}).
	Type, Name string
	// URL is http://<host>:<port> of the named server.
	URL string
}

// Checkpoint is Gym's global checkpoint block.
type Checkpoint struct {
	// Enabled: checkpointing is off unless true.
	Enabled bool
	// ControlAuthToken is the bearer token of every control route
	// (required when Enabled).
	ControlAuthToken string
	// LeaseGrace is lease_grace_seconds (default 600 s).
	LeaseGrace time.Duration
}

// Settings is what a Gym config says about this server.
type Settings struct {
	// Config is serve's configuration: config.Default, then the ngdriver
	// block, then what Gym's keys set.
	Config config.Config
	// Instance is this server's top-level name; AgentType the key under
	// responses_api_agents (the folder Gym's launcher runs it in).
	Instance, AgentType string
	// ResourcesServer is the resources_server reference (the owner).
	ResourcesServer Ref
	// ModelServer is the model_server reference, if the stanza has one.
	ModelServer *Ref
	// Checkpoint is the global checkpoint block (zero value but
	// LeaseGrace when the config has none).
	Checkpoint Checkpoint
	// Verbose is Gym's global verbose key (Gym's servers log at debug
	// level then).
	Verbose bool
	// Ignored lists the keys of the stanza that ngdriver does not use,
	// as dotted paths, sorted.
	Ignored []string
}

// Load reads a Gym config document from a file; known is what is built
// in.
func Load(path, instance string, known config.Known) (*Settings, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read gym config: %w", err)
	}
	s, err := Parse(data, instance, known)
	if err != nil {
		return nil, fmt.Errorf("gym config %s: %w", path, err)
	}
	return s, nil
}

// FromEnv reads the config Gym's launcher passed in NEMO_GYM_CONFIG_DICT;
// ok is false when the variable is not set.
func FromEnv(instance string, known config.Known) (s *Settings, ok bool, err error) {
	data, ok := os.LookupEnv(EnvConfigDict)
	if !ok {
		return nil, false, nil
	}
	s, err = Parse([]byte(data), instance, known)
	if err != nil {
		return nil, true, fmt.Errorf("gym config in $%s: %w", EnvConfigDict, err)
	}
	return s, true, nil
}

// Parse reads a whole Gym config document and maps this server's entry.
// instance names the entry; empty means $NEMO_GYM_CONFIG_PATH, else the
// only agent entry holding an ngdriver block. known is what is built in:
// the names the block's adapter may take, its sections and its backends.
func Parse(data []byte, instance string, known config.Known) (*Settings, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, errors.New(oneLine(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, errors.New("the config is empty")
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: the config is not a mapping of server instances", root.Line)
	}
	g := &gym{root: root, known: known}
	if instance == "" {
		instance = os.Getenv(EnvConfigPath)
	}
	if instance == "" {
		var err error
		if instance, err = g.soleNgdriverAgent(); err != nil {
			return nil, err
		}
	}
	return g.settings(instance)
}

// gym is a parsed document, and what is built in.
type gym struct {
	root  *yaml.Node
	known config.Known
}

// soleNgdriverAgent is the one agent entry that has an ngdriver block.
func (g *gym) soleNgdriverAgent() (string, error) {
	var found []string
	for name, n := range pairs(g.root) {
		if typ, inner, err := g.server(name, n); err == nil && typ == AgentType && lookup(inner.Content[1], OurKey) != nil {
			found = append(found, name)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("no %s entry has an %s block, and $%s names none", AgentType, OurKey, EnvConfigPath)
	}
	return "", fmt.Errorf("%d agent entries have an %s block (%s): name this server's with $%s or --gym-instance",
		len(found), OurKey, strings.Join(found, ", "), EnvConfigPath)
}

// server unwraps <name>: {<type>: {<impl>: {...}}} to the type and the
// {<impl>: {...}} mapping, each level holding one key, as Gym's
// get_first_server_config_dict does.
func (g *gym) server(name string, entry *yaml.Node) (typ string, inner *yaml.Node, err error) {
	if entry == nil {
		return "", nil, fmt.Errorf("no entry %q in the config", name)
	}
	if entry.Kind != yaml.MappingNode || len(entry.Content) != 2 {
		return "", nil, fmt.Errorf("line %d: %s is not a server entry (want one server type under it)", entry.Line, name)
	}
	typ, inner = entry.Content[0].Value, entry.Content[1]
	if inner.Kind != yaml.MappingNode || len(inner.Content) != 2 || inner.Content[1].Kind != yaml.MappingNode {
		return "", nil, fmt.Errorf("line %d: %s.%s is not a server entry (want one server under it)", inner.Line, name, typ)
	}
	return typ, inner, nil
}

func (g *gym) settings(instance string) (*Settings, error) {
	typ, inner, err := g.server(instance, lookup(g.root, instance))
	// inner is {<agent type>: {...}}.
	if err != nil {
		return nil, fmt.Errorf("this server's entry: %w", err)
	}
	if typ != AgentType {
		return nil, fmt.Errorf("%s is a %s entry; ngdriver serve is an agent server (%s)", instance, typ, AgentType)
	}
	s := &Settings{Instance: instance, AgentType: inner.Content[0].Value, Config: config.Default()}
	server := inner.Content[1]
	at := instance + "." + AgentType + "." + s.AgentType
	used := map[string]bool{"entrypoint": true}
	cfg := &s.Config

	if ours := lookup(server, OurKey); ours != nil {
		used[OurKey] = true
		if err := g.decodeOurs(ours, cfg, at+"."+OurKey); err != nil {
			return nil, err
		}
	}
	cfg.Name = instance

	used["host"], used["port"] = true, true
	if cfg.Listen, err = g.address(server, at); err != nil {
		return nil, err
	}

	used["resources_server"] = true
	ref, err := g.ref(server, "resources_server", ResourcesType, at)
	if err != nil {
		return nil, err
	}
	if ref == nil {
		return nil, fmt.Errorf("%s: no resources_server (the owner ngdriver drives sandboxes through)", at)
	}
	s.ResourcesServer, cfg.Owner.URL = *ref, ref.URL

	used["model_server"] = true
	if s.ModelServer, err = g.ref(server, "model_server", ModelType, at); err != nil {
		return nil, err
	}
	if err := g.adapterSection(server, s, used, at); err != nil {
		return nil, err
	}
	if s.Checkpoint, err = g.checkpoint(); err != nil {
		return nil, err
	}
	cfg.Token, cfg.TokenEnv = s.Checkpoint.ControlAuthToken, ""
	if v, err := g.scalar(g.root, "verbose", "verbose"); err == nil && v != "" {
		s.Verbose, _ = strconv.ParseBool(v)
	}
	cfg.LeaseGrace = config.Duration(s.Checkpoint.LeaseGrace)

	for key := range pairs(server) {
		if !used[key] {
			s.Ignored = append(s.Ignored, at+"."+key)
		}
	}
	slices.Sort(s.Ignored)
	if err := cfg.Validate(g.known); err != nil {
		return nil, fmt.Errorf("%s.%s: %w", at, OurKey, err)
	}
	return s, nil
}

// gymOwned are the keys of our block that Gym's keys set instead.
var gymOwned = map[string]string{
	"listen":      "host and port",
	"name":        "the instance name",
	"token":       "checkpoint.control_auth_token",
	"token_env":   "checkpoint.control_auth_token",
	"lease_grace": "checkpoint.lease_grace_seconds",
}

// decodeOurs reads the ngdriver block strictly over the defaults.
func (g *gym) decodeOurs(n *yaml.Node, cfg *config.Config, at string) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: %s is not a mapping", n.Line, at)
	}
	for key, v := range pairs(n) {
		if from, ok := gymOwned[key]; ok {
			return fmt.Errorf("line %d: %s.%s: set by Gym's %s in a Gym config; remove it", v.Line, at, key, from)
		}
	}
	if owner := lookup(n, "owner"); owner != nil && lookup(owner, "url") != nil {
		return fmt.Errorf("line %d: %s.owner.url: set by resources_server in a Gym config; remove it", owner.Line, at)
	}
	if err := g.known.Adapters.CheckSections(n, at+"."); err != nil {
		return err
	}
	if err := g.known.Backends.CheckSections(n, at+"."); err != nil {
		return err
	}
	if err := checkKeys(n, reflect.TypeFor[config.Config](), at); err != nil {
		return err
	}
	if err := g.interpolate(n, at); err != nil {
		return err
	}
	if err := n.Decode(cfg); err != nil {
		return fmt.Errorf("%s: %s", at, oneLine(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	return nil
}

// address is host:port of a server stanza; host defaults as Gym's does
// (default_host, else 127.0.0.1).
func (g *gym) address(server *yaml.Node, at string) (string, error) {
	host, err := g.scalar(server, "host", at)
	if err != nil {
		return "", err
	}
	if host == "" {
		if host, err = g.scalar(g.root, "default_host", "default_host"); err != nil {
			return "", err
		}
	}
	if host == "" {
		host = "127.0.0.1"
	}
	port, err := g.scalar(server, "port", at)
	if err != nil {
		return "", err
	}
	if port == "" {
		return "", fmt.Errorf("%s: no port (Gym's launcher fills host and port; a config file must give them)", at)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 {
		return "", fmt.Errorf("%s.port: %q is not a port number", at, port)
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// ref resolves the reference under key (nil when absent or null).
func (g *gym) ref(server *yaml.Node, key, want, at string) (*Ref, error) {
	n := lookup(server, key)
	if n == nil || n.Tag == "!!null" {
		return nil, nil
	}
	at += "." + key
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: %s is not a {type, name} reference", n.Line, at)
	}
	typ, err := g.scalar(n, "type", at)
	if err != nil {
		return nil, err
	}
	name, err := g.scalar(n, "name", at)
	if err != nil {
		return nil, err
	}
	switch {
	case typ != want:
		return nil, fmt.Errorf("line %d: %s.type is %q, want %s", n.Line, at, typ, want)
	case name == "" || name == "???":
		return nil, fmt.Errorf("line %d: %s.name is not set", n.Line, at)
	}
	gotType, url, err := g.url(name)
	switch {
	case errors.Is(err, errNoAddress):
		return nil, fmt.Errorf("%s names %s %q, which has no host and port in the config", at, typ, name)
	case err != nil:
		return nil, fmt.Errorf("%s names %s %q: %w", at, typ, name, err)
	case gotType != typ:
		return nil, fmt.Errorf("%s names %s %q, but that entry is a %s entry", at, typ, name, gotType)
	}
	return &Ref{Type: typ, Name: name, URL: url}, nil
}

// errNoAddress: a server entry without host and port.
var errNoAddress = errors.New("no host and port in the config")

// url resolves entry name as Gym's ServerClient does: its single server
// type and server, and http://<host>:<port> of that server.
func (g *gym) url(name string) (typ, url string, err error) {
	typ, target, err := g.server(name, lookup(g.root, name))
	if err != nil {
		return "", "", err
	}
	at := name + "." + typ + "." + target.Content[0].Value
	host, err := g.scalar(target.Content[1], "host", at)
	if err != nil {
		return typ, "", err
	}
	port, err := g.scalar(target.Content[1], "port", at)
	if err != nil {
		return typ, "", err
	}
	if host == "" || port == "" || port == "-1" {
		return typ, "", fmt.Errorf("%s: %w", at, errNoAddress)
	}
	return typ, "http://" + net.JoinHostPort(host, port), nil
}

// Server is one server entry of a Gym config, as Gym's checkpoint
// coordinator finds it.
type Server struct {
	// Name is the top-level entry's name (the coordinator's server name).
	Name string
	// URL is http://<host>:<port> of its server; "" when Err is set.
	URL string
	// Err says why the entry names no server Gym could reach (no host
	// and port, not one server under one type): the coordinator's
	// request to it would fail, so discovery fails for it.
	Err error
}

// Servers lists, in document order, the entries Gym's coordinator probes
// at discovery (coordination.py discover at 011c3386d691): every
// top-level entry that is a mapping holding one of ServerTypes, each with
// the URL Gym's ServerClient would reach it at. An error is a document
// that is not a mapping of entries.
func Servers(data []byte) ([]Server, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, errors.New(oneLine(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("the config is not a mapping of server instances")
	}
	g := &gym{root: doc.Content[0]}
	var out []Server
	for name, entry := range pairs(g.root) {
		if !slices.ContainsFunc(ServerTypes, func(t string) bool { return lookup(entry, t) != nil }) {
			continue
		}
		_, url, err := g.url(name)
		out = append(out, Server{Name: name, URL: url, Err: err})
	}
	return out, nil
}

// adapterSection fills the section of the adapter the config selects:
// model_url from the model server (for an adapter whose harness calls
// one) and the keys the adapter maps from Gym's own agent for its harness
// (config.AdapterKeys.Gym: Gym's OpenCode agent's for opencode; with
// another adapter they are ignored). What the ngdriver block's section
// says wins.
func (g *gym) adapterSection(server *yaml.Node, s *Settings, used map[string]bool, at string) error {
	cfg := &s.Config
	keys, ok := g.known.Adapters[cfg.Adapter]
	if !ok {
		return nil // Validate names it
	}
	sec := cfg.Sections[cfg.Adapter]
	if sec == nil {
		sec = map[string]any{}
	}
	set := func(key string, v any) {
		if _, ok := sec[key]; !ok {
			sec[key] = v
		}
	}
	if s.ModelServer != nil && keys.Model {
		set("model_url", s.ModelServer.URL)
	}
	if err := g.gymKeys(server, s, used, at, keys.Gym, set); err != nil {
		return err
	}
	if len(sec) > 0 {
		if cfg.Sections == nil {
			cfg.Sections = map[string]map[string]any{}
		}
		cfg.Sections[cfg.Adapter] = sec
	}
	return nil
}

// gymKeys sets (through set) the section's keys that keys map from the
// stanza's. A mapping a dotted key reaches into is used; its keys that
// none maps are reported as ignored.
func (g *gym) gymKeys(server *yaml.Node, s *Settings, used map[string]bool, at string, keys []config.GymKey, set func(string, any)) error {
	mapped := map[string][]string{} // a mapping reached into -> its keys mapped
	for _, k := range keys {
		if parent, leaf, ok := strings.Cut(k.Gym, "."); ok {
			mapped[parent] = append(mapped[parent], leaf)
		}
	}
	reached := map[string]bool{}
	for _, k := range keys {
		n, key, where := server, k.Gym, at
		parent, leaf, nested := strings.Cut(k.Gym, ".")
		if nested {
			n, key, where = lookup(server, parent), leaf, at+"."+parent
		}
		v, found, err := g.gymValue(n, key, where, k.As)
		if err != nil {
			return err
		}
		if !found {
			continue
		}
		set(k.Ours, v)
		if !nested {
			used[key] = true
		} else if !reached[parent] {
			reached[parent], used[parent] = true, true
			for other := range pairs(n) {
				if !slices.Contains(mapped[parent], other) {
					s.Ignored = append(s.Ignored, at+"."+parent+"."+other)
				}
			}
		}
	}
	return nil
}

// gymValue reads key of mapping n as as says; found is false when the
// key is absent (or, but for GymAny, null or empty).
func (g *gym) gymValue(n *yaml.Node, key, at string, as config.GymValue) (v any, found bool, err error) {
	if as == config.GymAny {
		node := lookup(n, key)
		if node == nil {
			return nil, false, nil
		}
		if err := g.interpolate(node, at+"."+key); err != nil {
			return nil, false, err
		}
		if err := node.Decode(&v); err != nil {
			return nil, false, fmt.Errorf("%s.%s: %v", at, key, err)
		}
		return v, true, nil
	}
	str, err := g.scalar(n, key, at)
	if err != nil || str == "" {
		return nil, false, err
	}
	switch as {
	case config.GymCount:
		c, err := strconv.Atoi(str)
		if err != nil || c <= 0 {
			return nil, false, fmt.Errorf("%s.%s: %q is not a positive token count", at, key, str)
		}
		return c, true, nil
	case config.GymSeconds:
		sec, err := strconv.ParseFloat(str, 64)
		if err != nil || sec <= 0 {
			return nil, false, fmt.Errorf("%s.%s: %q is not a positive number of seconds", at, key, str)
		}
		return time.Duration(sec * float64(time.Second)).String(), true, nil
	}
	return str, true, nil
}

// checkpoint reads the global checkpoint block as Gym's
// CheckpointSettings does: only its three keys, a token when enabled, a
// positive grace.
func (g *gym) checkpoint() (Checkpoint, error) {
	c := Checkpoint{LeaseGrace: DefaultLeaseGrace}
	n := lookup(g.root, "checkpoint")
	if n == nil || n.Tag == "!!null" {
		return c, nil
	}
	if n.Kind != yaml.MappingNode {
		return c, fmt.Errorf("line %d: checkpoint is not a mapping", n.Line)
	}
	for key, v := range pairs(n) {
		val, err := g.scalar(n, key, "checkpoint")
		if err != nil {
			return c, err
		}
		switch key {
		case "enabled":
			b, err := strconv.ParseBool(val)
			if val != "" && err != nil {
				return c, fmt.Errorf("line %d: checkpoint.enabled: %q is not true or false", v.Line, val)
			}
			c.Enabled = b
		case "control_auth_token":
			c.ControlAuthToken = val
		case "lease_grace_seconds":
			sec, err := strconv.ParseFloat(val, 64)
			if err != nil || sec <= 0 {
				return c, fmt.Errorf("line %d: checkpoint.lease_grace_seconds: %q is not a positive number", v.Line, val)
			}
			c.LeaseGrace = time.Duration(sec * float64(time.Second))
		default:
			return c, fmt.Errorf("line %d: checkpoint.%s: unknown key (want enabled, control_auth_token, lease_grace_seconds)", v.Line, key)
		}
	}
	if c.Enabled && c.ControlAuthToken == "" {
		return c, errors.New("checkpoint.control_auth_token is required when checkpoint.enabled is true")
	}
	if !c.Enabled {
		// Gym installs no participant then; ngdriver refuses every control
		// call instead of accepting a token nobody checks for.
		c.ControlAuthToken = ""
	}
	return c, nil
}

// scalar is the interpolated string value of key in n ("" when absent or
// null); a mapping or list there is an error.
func (g *gym) scalar(n *yaml.Node, key, at string) (string, error) {
	v := lookup(n, key)
	if v == nil || v.Tag == "!!null" {
		return "", nil
	}
	if v.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("line %d: %s.%s is not a single value", v.Line, at, key)
	}
	return g.resolve(v.Value, at+"."+key, 0)
}

// interpolate resolves every ${...} in the scalars under n, in place.
func (g *gym) interpolate(n *yaml.Node, at string) error {
	if n.Kind == yaml.ScalarNode {
		if !strings.Contains(n.Value, "${") {
			return nil
		}
		v, err := g.resolve(n.Value, at, 0)
		if err != nil {
			return err
		}
		n.Value, n.Tag, n.Style = v, "", 0
		return nil
	}
	for i, c := range n.Content {
		where := at
		if n.Kind == yaml.MappingNode && i%2 == 1 {
			where = at + "." + n.Content[i-1].Value
		}
		if n.Kind == yaml.MappingNode && i%2 == 0 {
			continue
		}
		if err := g.interpolate(c, where); err != nil {
			return err
		}
	}
	return nil
}

// resolve expands OmegaConf interpolations as the launcher left them
// (OmegaConf.to_yaml does not resolve): ${a.b.c} (an absolute key path to
// a single value) and ${oc.env:NAME} or ${oc.env:NAME,default}.
func (g *gym) resolve(s, at string, depth int) (string, error) {
	if depth > 8 {
		return "", fmt.Errorf("%s: interpolations nest too deep", at)
	}
	var out strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			out.WriteString(s)
			return out.String(), nil
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("%s: unclosed interpolation in %q", at, s)
		}
		out.WriteString(s[:i])
		expr := s[i+2 : i+j]
		v, err := g.expand(expr, at, depth)
		if err != nil {
			return "", err
		}
		out.WriteString(v)
		s = s[i+j+1:]
	}
}

func (g *gym) expand(expr, at string, depth int) (string, error) {
	if env, ok := strings.CutPrefix(expr, "oc.env:"); ok {
		name, def, hasDef := strings.Cut(env, ",")
		if v, ok := os.LookupEnv(strings.TrimSpace(name)); ok {
			return v, nil
		}
		if hasDef {
			return strings.Trim(strings.TrimSpace(def), `'"`), nil
		}
		return "", fmt.Errorf("%s: ${%s}: environment variable %s is not set", at, expr, name)
	}
	if strings.ContainsAny(expr, ":${} ") || strings.HasPrefix(expr, ".") || expr == "" {
		return "", fmt.Errorf("%s: interpolation ${%s} is not supported (only ${key.path} and ${oc.env:NAME})", at, expr)
	}
	n := g.root
	for _, k := range strings.Split(expr, ".") {
		if n = lookup(n, k); n == nil {
			return "", fmt.Errorf("%s: ${%s}: no key %s in the config", at, expr, expr)
		}
	}
	if n.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("%s: ${%s} is not a single value", at, expr)
	}
	return g.resolve(n.Value, at, depth+1)
}

// lookup is the value of key in mapping n (nil when absent or n is not a
// mapping).
func lookup(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// pairs iterates over mapping n's keys and values in order.
func pairs(n *yaml.Node) func(func(string, *yaml.Node) bool) {
	return func(yield func(string, *yaml.Node) bool) {
		if n == nil || n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if !yield(n.Content[i].Value, n.Content[i+1]) {
				return
			}
		}
	}
}

// checkKeys refuses a key of mapping n that struct type t has no yaml
// field for, recursing into struct fields (maps and untyped values are
// checked later by their own decoders). A struct with an inline map takes
// any other key (Config's adapter sections: Adapters.CheckSections checks
// them).
func checkKeys(n *yaml.Node, t reflect.Type, at string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || n.Kind != yaml.MappingNode || t == reflect.TypeFor[config.Duration]() {
		return nil
	}
	fields := map[string]reflect.Type{}
	inline := false
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" && f.Type.Kind() == reflect.Map {
			inline = true
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	for key, v := range pairs(n) {
		ft, ok := fields[key]
		if !ok && inline {
			continue
		}
		if !ok {
			return fmt.Errorf("line %d: %s.%s: unknown key", v.Line, at, key)
		}
		if err := checkKeys(v, ft, at+"."+key); err != nil {
			return err
		}
	}
	return nil
}

// oneLine folds a multi-line message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}
