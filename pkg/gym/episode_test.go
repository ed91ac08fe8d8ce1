package gym

import (
	"encoding/json"
	"testing"
)

// Ports test_capture_key_qualifies_retries (test_episode_types.py) and the
// cases EpisodeId.from_capture_key and reserve_attempt_suffix decide
// (episode_types.py 05bf55a).
func TestCaptureKeys(t *testing.T) {
	for _, tc := range []struct {
		id  EpisodeID
		key string
	}{
		{EpisodeID{"r", 0}, "r"},
		{EpisodeID{"r", 2}, "r-a2"},
		{EpisodeID{"r", 10}, "r-a10"},
		{EpisodeID{"0-3", 1}, "0-3-a1"},
		{EpisodeID{"r-a0", 0}, "r-a0"},   // -a0 is not the reserved suffix
		{EpisodeID{"r-a01", 0}, "r-a01"}, // nor is a leading zero
		{EpisodeID{"r-a01", 3}, "r-a01-a3"},
		{EpisodeID{"a.b_c", 0}, "a.b_c"},
	} {
		if got := tc.id.CaptureKey(); got != tc.key {
			t.Errorf("%+v.CaptureKey() = %q, want %q", tc.id, got, tc.key)
		}
		back, err := ParseCaptureKey(tc.key)
		if err != nil || back != tc.id {
			t.Errorf("ParseCaptureKey(%q) = %+v, %v; want %+v", tc.key, back, err, tc.id)
		}
	}
	for _, key := range []string{"", "-a2", "r-a1-a2", ".r", "r/x", "r x", "r\n", "_r", "r-a99999999999999999999999"} {
		if id, err := ParseCaptureKey(key); err == nil {
			t.Errorf("ParseCaptureKey(%q) = %+v, want an error", key, id)
		}
	}
}

// Ports EpisodeId's model (extra="forbid", rollout id pattern, reserved
// suffix, attempt >= 0, attempt defaulting to 0) as the wire reads it.
func TestEpisodeIDJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want EpisodeID
	}{
		{`{"rollout_id":"r"}`, EpisodeID{"r", 0}},
		{`{"rollout_id":"r","attempt":2}`, EpisodeID{"r", 2}},
		{`{"attempt":2.0,"rollout_id":"r"}`, EpisodeID{"r", 2}},
		{` {"rollout_id":"r-a0","attempt":0} `, EpisodeID{"r-a0", 0}},
	} {
		var got EpisodeID
		if err := json.Unmarshal([]byte(tc.in), &got); err != nil || got != tc.want {
			t.Errorf("%s -> %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{
		`"r"`, `null`, `[]`, `{}`,
		`{"rollout_id":"r","extra":1}`,
		`{"Rollout_ID":"r"}`,
		`{"rollout_id":"r-a2"}`,
		`{"rollout_id":"r","attempt":-1}`,
		`{"rollout_id":"r","attempt":1.5}`,
		`{"rollout_id":"r","attempt":null}`,
		`{"rollout_id":""}`,
		`{"rollout_id":"../x"}`,
		`{"rollout_id":7}`,
	} {
		var got EpisodeID
		err := json.Unmarshal([]byte(in), &got)
		if err == nil {
			t.Errorf("%s -> %+v, want an error", in, got)
			continue
		}
		wantCode(t, err, CodeInvalidRequest)
	}
	out, _ := json.Marshal(EpisodeID{"r", 0})
	if string(out) != `{"rollout_id":"r","attempt":0}` {
		t.Errorf("marshal = %s", out)
	}
}
