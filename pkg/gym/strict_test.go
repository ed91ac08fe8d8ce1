package gym_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/gym"
)

type strictInner struct {
	Name string `json:"name"`
	N    int    `json:"n,omitempty"`
}

type strictOuter struct {
	ID      gym.EpisodeID          `json:"episode_id"`
	Key     string                 `json:"key"`
	Inner   strictInner            `json:"inner"`
	Ptr     *strictInner           `json:"ptr,omitempty"`
	List    []strictInner          `json:"list,omitempty"`
	ByName  map[string]strictInner `json:"by_name,omitempty"`
	Opaque  json.RawMessage        `json:"opaque,omitempty"`
	Ignored string                 `json:"-"`
}

// TestCheckStrict: names are matched exactly at every level (objects in
// slices and maps too), unknown and required names are named, null is
// refused where Go would silently take a zero value, and a type that
// decodes itself (an episode id, raw JSON) is left to its own check.
func TestCheckStrict(t *testing.T) {
	good := `{"episode_id": {"rollout_id": "r"}, "key": "k", "inner": {"name": "a"}, "ptr": null,
		"list": [{"name": "b", "n": 2}], "by_name": {"x": {"name": "c"}}, "opaque": {"Anything": null}}`
	if err := gym.CheckStrict([]byte(good), &strictOuter{}, "episode_id", "key"); err != nil {
		t.Fatalf("a good object: %v", err)
	}
	for _, c := range []struct{ data, says string }{
		{`{"key": "k", "extra": 1}`, `unknown field "extra"`},
		{`{"Key": "k"}`, `unknown field "Key"`},
		{`{"key": "k", "inner": {"Name": "a"}}`, `inner: unknown field "Name"`},
		{`{"key": "k", "list": [{"name": "a"}, {"nam": "b"}]}`, `list[1]: unknown field "nam"`},
		{`{"key": "k", "by_name": {"x": {"name": null}}}`, `by_name.x.name must not be null`},
		{`{"key": null}`, `key must not be null`},
		{`{"key": "k", "inner": null}`, `inner must be an object, not null`},
		{`{"key": "k", "Ignored": "x"}`, `unknown field "Ignored"`},
		{`{"inner": {"name": "a"}}`, `key is required`},
		{`[1]`, `not a JSON object`},
	} {
		err := gym.CheckStrict([]byte(c.data), &strictOuter{}, "key")
		if err == nil || !errors.Is(err, gym.ErrInvalidRequest) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("CheckStrict(%s) = %v, want an invalid request saying %q", c.data, err, c.says)
		}
	}
}

// TestDecodeStrictNamesTheEpisode: a record that fails the check is an
// invalid checkpoint state naming its episode; a good one is decoded.
func TestDecodeStrictNamesTheEpisode(t *testing.T) {
	r, err := gym.ParseRecord([]byte(`{"episode_id": {"rollout_id": "r7", "attempt": 2}, "key": "k", "Extra": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	var out strictOuter
	if err := r.DecodeStrict(&out, "key"); err == nil || !errors.Is(err, gym.ErrCheckpointState) || !strings.Contains(err.Error(), `"r7-a2"`) || !strings.Contains(err.Error(), `unknown field "Extra"`) {
		t.Fatalf("DecodeStrict = %v", err)
	}
	r, _ = gym.ParseRecord([]byte(`{"episode_id": {"rollout_id": "r7"}, "key": "k", "inner": {"name": "a", "n": 3}}`))
	if err := r.DecodeStrict(&out, "key"); err != nil || out.Key != "k" || out.Inner.N != 3 {
		t.Fatalf("DecodeStrict = %v, %+v", err, out)
	}
}
