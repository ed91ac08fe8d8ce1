package gymconfig

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ngharness/ngharness/pkg/driver/config"
)

// known stands for the adapter and backend tables of cmd/ngdriver
// (adapters.go holds opencode's Gym keys).
var known = config.Known{
	Adapters: config.Adapters{"fake": {}, "opencode": {Binary: "opencode", Model: true, Gym: []config.GymKey{
		{Gym: "remote_opencode_binary_path", Ours: "opencode", As: config.GymString},
		{Gym: "opencode_max_context_window", Ours: "context_window", As: config.GymCount},
		{Gym: "sandbox_timeout", Ours: "timeout", As: config.GymSeconds},
		{Gym: "opencode_config.permission", Ours: "permission", As: config.GymAny},
	}}, "codex": {Binary: "codex", Model: true}},
	Backends: config.BackendKinds{"local": config.KindOf[struct {
		Base       string `json:"base"`
		MountPoint string `json:"mount_point"`
		Isolation  string `json:"isolation"`
	}](nil)},
}

func fixture(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "launcher_dict.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestParseLauncherDict: the whole config Gym's launcher passes maps onto
// serve's settings: listen from host and port, the owner from
// resources_server, model_url from model_server, the token and lease grace
// from the checkpoint block, the OpenCode keys with an equivalent, and our
// block; Gym's other keys are listed as ignored.
func TestParseLauncherDict(t *testing.T) {
	t.Setenv(EnvConfigPath, "ngdriver_agent")
	s, err := Parse([]byte(fixture(t)), "", known)
	if err != nil {
		t.Fatal(err)
	}
	c := s.Config
	checks := []struct {
		what      string
		got, want any
	}{
		{"instance", s.Instance, "ngdriver_agent"},
		{"agent type", s.AgentType, "ngdriver_agent"},
		{"name", c.Name, "ngdriver_agent"},
		{"listen", c.Listen, "127.0.0.1:14013"},
		{"owner url", c.Owner.URL, "http://127.0.0.1:14011"},
		{"resources server", s.ResourcesServer.Name, "swebench_resources_server"},
		{"model server", s.ModelServer.URL, "http://127.0.0.1:14012"},
		{"token", c.Token, "fallback-token"},
		{"token_env", c.TokenEnv, ""},
		{"checkpoint enabled", s.Checkpoint.Enabled, true},
		{"lease grace", c.LeaseGrace.D(), 300 * time.Second},
		{"adapter", c.Adapter, "opencode"},
		{"max runs", c.MaxRuns, 32},
		{"stop grace", c.StopGrace.D(), 5 * time.Second},
		{"verify timeout", c.Owner.VerifyTimeout.D(), 10 * time.Minute},
		{"owner timeout (default)", c.Owner.Timeout.D(), 60 * time.Second},
		{"local base", c.Backends["local"]["base"], "/var/tmp/ngharness-local"},
		{"opencode model_url", c.Sections["opencode"]["model_url"], "http://127.0.0.1:14012"},
		{"opencode model (interpolated)", c.Sections["opencode"]["model"], "nemotron-super"},
		{"opencode binary", c.Sections["opencode"]["opencode"], "/usr/local/bin/opencode"},
		{"opencode context window", c.Sections["opencode"]["context_window"], 262144},
		{"opencode timeout", c.Sections["opencode"]["timeout"], "3h0m0s"},
		{"opencode output tokens", c.Sections["opencode"]["output_tokens"], 8192},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s: got %v (%T), want %v (%T)", ch.what, ch.got, ch.got, ch.want, ch.want)
		}
	}
	perm, _ := json.Marshal(c.Sections["opencode"]["permission"])
	if want := `{"*":"allow","bash":{"*":"allow","*pkill*":"deny"}}`; string(perm) != want {
		t.Errorf("permission %s, want %s", perm, want)
	}
	at := "ngdriver_agent.responses_api_agents.ngdriver_agent."
	want := []string{at + "datasets", at + "num_workers", at + "opencode_config.tools",
		at + "opencode_model_call_timeout", at + "opencode_version", at + "skip_verification"}
	if !slices.Equal(s.Ignored, want) {
		t.Errorf("ignored %q, want %q", s.Ignored, want)
	}
	t.Setenv("GYMCONFIG_TEST_TOKEN", "from-env")
	if s, err = Parse([]byte(fixture(t)), "", known); err != nil || s.Config.Token != "from-env" {
		t.Errorf("token from ${oc.env:...}: %v, %v", s, err)
	}
}

// TestParseJSONAndSoleAgent: the same document as JSON parses the same, and
// with no instance named the only agent entry with an ngdriver block is
// this server's.
func TestParseJSONAndSoleAgent(t *testing.T) {
	t.Setenv(EnvConfigPath, "")
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(fixture(t)), &doc); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Parse(data, "", known)
	if err != nil {
		t.Fatal(err)
	}
	if s.Instance != "ngdriver_agent" || s.Config.Listen != "127.0.0.1:14013" || s.Config.Owner.URL != "http://127.0.0.1:14011" {
		t.Errorf("from JSON: instance %q listen %q owner %q", s.Instance, s.Config.Listen, s.Config.Owner.URL)
	}
}

// TestFromEnvAndLoad: FromEnv reads $NEMO_GYM_CONFIG_DICT (and says when it
// is unset); Load reads the same document from a file and names it in
// errors.
func TestFromEnvAndLoad(t *testing.T) {
	t.Setenv(EnvConfigPath, "ngdriver_agent")
	os.Unsetenv(EnvConfigDict)
	if _, ok, err := FromEnv("", known); ok || err != nil {
		t.Fatalf("unset: ok %v err %v", ok, err)
	}
	t.Setenv(EnvConfigDict, fixture(t))
	s, ok, err := FromEnv("", known)
	if !ok || err != nil || s.Config.Listen != "127.0.0.1:14013" {
		t.Fatalf("from env: %v %v %v", s, ok, err)
	}
	t.Setenv(EnvConfigDict, "ngdriver_agent: [")
	if _, _, err := FromEnv("", known); err == nil || !strings.Contains(err.Error(), EnvConfigDict) {
		t.Errorf("bad env: %v, want an error naming %s", err, EnvConfigDict)
	}
	path := filepath.Join(t.TempDir(), "run.yaml")
	os.WriteFile(path, []byte(strings.Replace(fixture(t), "max_runs: 32", "max_runz: 32", 1)), 0o644)
	if _, err := Load(path, "", known); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "max_runz") {
		t.Errorf("bad file: %v, want an error naming the file and the key", err)
	}
}

// TestCheckpointOff: without a checkpoint block (or with enabled false)
// no token is set, so every control call is refused, and the grace is
// Gym's default.
func TestCheckpointOff(t *testing.T) {
	base := fixture(t)
	i := strings.Index(base, "checkpoint:\n")
	j := strings.Index(base, "head_server:\n")
	for name, block := range map[string]string{
		"absent":   "",
		"disabled": "checkpoint:\n  enabled: false\n  control_auth_token: abc\n",
	} {
		s, err := Parse([]byte(base[:i]+block+base[j:]), "ngdriver_agent", known)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Config.Token != "" || s.Checkpoint.Enabled || s.Config.LeaseGrace.D() != DefaultLeaseGrace {
			t.Errorf("%s: token %q enabled %v grace %v", name, s.Config.Token, s.Checkpoint.Enabled, s.Config.LeaseGrace.D())
		}
	}
}

// TestParseErrors: each bad config is refused with one line naming what
// is wrong.
func TestParseErrors(t *testing.T) {
	base := fixture(t)
	t.Setenv("GYMCONFIG_TEST_UNSET", "")
	os.Unsetenv("GYMCONFIG_TEST_UNSET")
	cases := []struct {
		name     string
		old, new string
		instance string
		words    []string
	}{
		{"no entry for this server", "", "", "other_agent", []string{"other_agent"}},
		{"entry is not an agent", "", "", "policy_model", []string{"policy_model", "responses_api_models"}},
		{"unknown key of ours", "max_runs: 32", "max_runz: 32", "", []string{"max_runz", "unknown key", "line"}},
		{"unknown nested key of ours", "isolation: none", "isolatoin: none", "", []string{"ngdriver.backends.local.isolatoin"}},
		{"bad value of ours", "stop_grace: 5s", "stop_grace: soon", "", []string{"soon"}},
		{"bad adapter", "adapter: opencode", "adapter: opencod", "", []string{"opencod"}},
		{"gym-owned listen", "max_runs: 32", "listen: 0.0.0.0:1", "", []string{"ngdriver.listen", "host and port"}},
		{"gym-owned token", "max_runs: 32", "token: x", "", []string{"ngdriver.token", "control_auth_token"}},
		{"gym-owned owner url", "verify_timeout: 10m", "url: http://x", "", []string{"owner.url", "resources_server"}},
		{"resources server not in the dict", "name: swebench_resources_server", "name: swebench_resource_server", "",
			[]string{"resources_server", "swebench_resource_server", "no entry"}},
		{"model server not in the dict", "name: policy_model\n", "name: polcy_model\n", "", []string{"model_server", "polcy_model"}},
		{"reference of the wrong type", "type: responses_api_models\n        name: policy_model", "type: resources_servers\n        name: policy_model", "",
			[]string{"model_server.type", "responses_api_models"}},
		{"reference to an entry of another type", "name: swebench_resources_server", "name: policy_model", "",
			[]string{"policy_model", "responses_api_models entry"}},
		{"unset reference", "name: swebench_resources_server", "name: ???", "", []string{"resources_server.name"}},
		{"no resources server", "      resources_server:\n        type: resources_servers\n        name: swebench_resources_server\n", "", "",
			[]string{"no resources_server"}},
		{"no port", "      host: 127.0.0.1\n      port: 14013\n", "", "", []string{"no port"}},
		{"bad port", "port: 14013", "port: 99999", "", []string{"port", "99999"}},
		{"referenced server without port", "      host: 127.0.0.1\n      port: 14011\n", "", "", []string{"swebench_resources_server", "host and port"}},
		{"unknown checkpoint key", "lease_grace_seconds: 300", "lease_grace: 300", "", []string{"checkpoint.lease_grace", "unknown key"}},
		{"enabled without token", "  control_auth_token: ${oc.env:GYMCONFIG_TEST_TOKEN,fallback-token}\n", "", "", []string{"control_auth_token", "required"}},
		{"bad lease grace", "lease_grace_seconds: 300", "lease_grace_seconds: 0", "", []string{"lease_grace_seconds"}},
		{"bad enabled", "enabled: true", "enabled: maybe", "", []string{"checkpoint.enabled", "maybe"}},
		{"unsupported interpolation", "model: ${policy_model_name}\n          output", "model: ${oc.select:x}\n          output", "",
			[]string{"oc.select", "not supported"}},
		{"unset environment variable", "${oc.env:GYMCONFIG_TEST_TOKEN,fallback-token}", "${oc.env:GYMCONFIG_TEST_UNSET}", "",
			[]string{"GYMCONFIG_TEST_UNSET"}},
		{"interpolation of a missing key", "model: ${policy_model_name}\n          output", "model: ${policy_model_nam}\n          output", "",
			[]string{"policy_model_nam"}},
		{"bad context window", "opencode_max_context_window: 262144", "opencode_max_context_window: big", "",
			[]string{"opencode_max_context_window", "big"}},
		{"not yaml", "", "", "", nil},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			doc := base
			switch {
			case c.name == "not yaml":
				doc = "ngdriver_agent: [\n"
			case c.old != "":
				if !strings.Contains(doc, c.old) {
					t.Fatalf("the fixture has no %q", c.old)
				}
				doc = strings.Replace(doc, c.old, c.new, 1)
			}
			inst := c.instance
			if inst == "" {
				inst = "ngdriver_agent"
			}
			_, err := Parse([]byte(doc), inst, known)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error %q does not name %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("the error takes more than one line: %q", err)
			}
		})
	}
}

// TestSoleAgentAmbiguous: two agent entries with an ngdriver block and no
// instance named is an error listing both.
func TestSoleAgentAmbiguous(t *testing.T) {
	t.Setenv(EnvConfigPath, "")
	base := fixture(t)
	i := strings.Index(base, "ngdriver_agent:\n")
	j := strings.Index(base, "checkpoint:\n")
	second := strings.Replace(base[i:j], "ngdriver_agent:\n  responses", "ngdriver_agent_2:\n  responses", 1)
	_, err := Parse([]byte(base+"\n"+second), "", known)
	if err == nil || !strings.Contains(err.Error(), "ngdriver_agent_2") || !strings.Contains(err.Error(), "--gym-instance") {
		t.Errorf("got %v, want an error naming both entries", err)
	}
}

// TestExampleStanza: examples/gym's stanza, with what Gym's launcher adds
// (host and port of every entry, the other servers), is a valid config.
func TestExampleStanza(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "examples", "gym", "responses_api_agents",
		"ngdriver_agent", "configs", "ngdriver_agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(data), "      entrypoint: app.py\n", "      entrypoint: app.py\n      host: 127.0.0.1\n      port: 15001\n", 1)
	doc += `swebench_resources_server:
  resources_servers:
    swebench: {entrypoint: app.py, host: 127.0.0.1, port: 15002}
policy_model:
  responses_api_models:
    vllm_model: {entrypoint: app.py, host: 127.0.0.1, port: 15003}
`
	t.Setenv("NG_CONTROL_TOKEN", "example-token")
	s, err := Parse([]byte(doc), "ngdriver_agent", known)
	if err != nil {
		t.Fatal(err)
	}
	if s.Config.Listen != "127.0.0.1:15001" || s.Config.Owner.URL != "http://127.0.0.1:15002" ||
		s.Config.Sections["opencode"]["model_url"] != "http://127.0.0.1:15003" || s.Config.Token != "example-token" {
		t.Errorf("example: listen %q owner %q model %v token %q", s.Config.Listen, s.Config.Owner.URL,
			s.Config.Sections["opencode"]["model_url"], s.Config.Token)
	}
}

// withAdapter is the fixture with the ngdriver block selecting adapter
// and holding section (YAML lines indented under the block) instead of
// its opencode section.
func withAdapter(t *testing.T, adapter, section string) string {
	t.Helper()
	doc := fixture(t)
	old := "        opencode:\n          model: ${policy_model_name}\n          output_tokens: 8192\n"
	if !strings.Contains(doc, old) || !strings.Contains(doc, "adapter: opencode") {
		t.Fatal("the fixture's ngdriver block has changed")
	}
	doc = strings.Replace(doc, old, section, 1)
	return strings.Replace(doc, "adapter: opencode", "adapter: "+adapter, 1)
}

// TestModelServerToSelectedAdapter: model_server's URL goes to the section
// of the adapter the block selects (codex here; an adapter the table
// gains, claude, alike), unless that section gives its own; Gym's
// OpenCode agent keys fill no section then and are listed as ignored; an
// adapter without a model server (fake) gets no model_url.
func TestModelServerToSelectedAdapter(t *testing.T) {
	s, err := Parse([]byte(withAdapter(t, "codex", "        codex:\n          codex: /opt/codex\n          model: ${policy_model_name}\n")), "ngdriver_agent", known)
	if err != nil {
		t.Fatal(err)
	}
	cx := s.Config.Sections["codex"]
	if s.Config.Adapter != "codex" || cx["model_url"] != "http://127.0.0.1:14012" || cx["model"] != "nemotron-super" || cx["codex"] != "/opt/codex" {
		t.Errorf("adapter %q, codex section %v", s.Config.Adapter, cx)
	}
	if oc, ok := s.Config.Sections["opencode"]; ok {
		t.Errorf("an opencode section %v, with adapter codex", oc)
	}
	at := "ngdriver_agent.responses_api_agents.ngdriver_agent."
	for _, k := range []string{"remote_opencode_binary_path", "opencode_max_context_window", "opencode_config", "sandbox_timeout"} {
		if !slices.Contains(s.Ignored, at+k) {
			t.Errorf("%s not listed as ignored with adapter codex: %q", k, s.Ignored)
		}
	}

	s, err = Parse([]byte(withAdapter(t, "codex", "        codex:\n          model_url: http://gpu-1:8000\n")), "ngdriver_agent", known)
	if err != nil || s.Config.Sections["codex"]["model_url"] != "http://gpu-1:8000" {
		t.Errorf("the section's own model_url: %v, %v", s, err)
	}

	s, err = Parse([]byte(withAdapter(t, "fake", "")), "ngdriver_agent", known)
	if err != nil || len(s.Config.Sections) != 0 {
		t.Errorf("adapter fake: sections %v, %v; want none", s, err)
	}

	withClaude := config.Adapters{"claude": {Binary: "claude", Model: true}}
	s, err = Parse([]byte(withAdapter(t, "claude", "")), "ngdriver_agent", config.Known{Adapters: withClaude, Backends: known.Backends})
	if err != nil || s.Config.Sections["claude"]["model_url"] != "http://127.0.0.1:14012" {
		t.Errorf("a fifth adapter: %v, %v", s, err)
	}
}

// TestUnknownAdapterOrSection: in the ngdriver block, an adapter not built
// in and a section of none are refused naming them and the adapters
// there are.
func TestUnknownAdapterOrSection(t *testing.T) {
	for _, c := range []struct {
		doc   string
		words []string
	}{
		{withAdapter(t, "claude", ""), []string{"ngdriver", "claude", "codex, fake, opencode"}},
		{withAdapter(t, "codex", "        codx:\n          codex: /opt/codex\n"), []string{"line", "ngdriver.codx", "unknown key"}},
		{withAdapter(t, "codex", "        codex: /opt/codex\n"), []string{"line", "ngdriver.codex", "want a mapping"}},
	} {
		_, err := Parse([]byte(c.doc), "ngdriver_agent", known)
		if err == nil {
			t.Errorf("no error for %v", c.words)
			continue
		}
		for _, w := range c.words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("the error %q does not name %q", err, w)
			}
		}
	}
}

// TestServers: the entries Gym's coordinator probes are the top-level
// mappings holding one of its four server types, in document order, each
// with its server's URL; the checkpoint block and other keys are not
// servers, and an entry Gym could not reach (no port, two servers) is
// listed with the reason.
func TestServers(t *testing.T) {
	doc := `
env: {environment_servers: {legacy_agent: {host: 127.0.0.1, port: 9001}}}
checkpoint: {enabled: true, control_auth_token: t}
policy_model: {responses_api_models: {vllm: {host: 10.0.0.2, port: 8000}}}
judge: {responses_api_models: {vllm: {host: 10.0.0.3}}}
agent: {responses_api_agents: {ngdriver_agent: {host: 127.0.0.1, port: 9002}}}
res: {resources_servers: {a: {host: h, port: 1}, b: {host: h, port: 2}}}
other: {some_key: 1}
default_host: 0.0.0.0
`
	got, err := Servers([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, s := range got {
		line := s.Name + " " + s.URL
		if s.Err != nil {
			line += " error"
		}
		lines = append(lines, line)
	}
	want := []string{"env http://127.0.0.1:9001", "policy_model http://10.0.0.2:8000", "judge  error", "agent http://127.0.0.1:9002", "res  error"}
	if !slices.Equal(lines, want) {
		t.Errorf("servers %q, want %q", lines, want)
	}
	if _, err := Servers([]byte("- a list")); err == nil {
		t.Errorf("a list was taken for a config")
	}
}

// TestGymKeysOfAnyAdapter: the keys an adapter maps from Gym's own agent
// for its harness come from its row (config.AdapterKeys.Gym), for any
// adapter: a Gym agent's keys for codex fill the codex section (a mapping
// reached into reports its other keys as ignored), a value that is not
// what its mapping reads is refused naming it, and opencode's keys are
// ignored then.
func TestGymKeysOfAnyAdapter(t *testing.T) {
	withCodexKeys := config.Known{Adapters: config.Adapters{"codex": {Binary: "codex", Model: true, Gym: []config.GymKey{
		{Gym: "codex_binary", Ours: "codex"},
		{Gym: "codex_config.turns", Ours: "max_turns", As: config.GymCount},
		{Gym: "codex_wait", Ours: "timeout", As: config.GymSeconds},
	}}}, Backends: known.Backends}
	stanza := "      codex_binary: /opt/codex\n      codex_wait: 90\n      codex_config: {turns: 12, model: x}\n      skip_verification: false\n"
	doc := strings.Replace(withAdapter(t, "codex", ""), "      skip_verification: false\n", stanza, 1)
	s, err := Parse([]byte(doc), "ngdriver_agent", withCodexKeys)
	if err != nil {
		t.Fatal(err)
	}
	sec := s.Config.Sections["codex"]
	if sec["codex"] != "/opt/codex" || sec["max_turns"] != 12 || sec["timeout"] != "1m30s" || sec["model_url"] != "http://127.0.0.1:14012" {
		t.Errorf("codex section %v", sec)
	}
	at := "ngdriver_agent.responses_api_agents.ngdriver_agent."
	for _, key := range []string{"codex_config.model", "opencode_max_context_window", "sandbox_timeout"} {
		if !slices.Contains(s.Ignored, at+key) {
			t.Errorf("%s is not reported as ignored: %q", key, s.Ignored)
		}
	}
	for _, key := range []string{"codex_binary", "codex_config", "codex_wait", "codex_config.turns"} {
		if slices.Contains(s.Ignored, at+key) {
			t.Errorf("%s is reported as ignored: %q", key, s.Ignored)
		}
	}
	bad := strings.Replace(doc, "turns: 12", "turns: many", 1)
	if _, err := Parse([]byte(bad), "ngdriver_agent", withCodexKeys); err == nil || !strings.Contains(err.Error(), "codex_config.turns") || !strings.Contains(err.Error(), "many") {
		t.Errorf("a count that is none: %v", err)
	}
}
