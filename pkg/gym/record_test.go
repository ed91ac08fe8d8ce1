package gym

import (
	"bytes"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"
)

// indented is a value whose MarshalJSON answers indented JSON, as a
// participant's own types might.
type indented struct{}

func (indented) MarshalJSON() ([]byte, error) {
	return []byte("{\n  \"a\": [1,\n 2],\n  \"b\": \"x y\"\n}"), nil
}

// benchRecord is an agent-like record: an episode id, a state and an
// episode of about 1.5 KB.
func benchRecord() map[string]any {
	launches := make([]map[string]any, 3)
	for i := range launches {
		launches[i] = map[string]any{"id": "soak-00042-a0-l1-0123456789ab", "sandbox_id": "sb-0123456789abcdef01234567-0",
			"outcome": "interrupted", "error": "paused at a checkpoint; gone if the driver crashed", "pauses": 3, "duration_s": 12.5,
			"reason": "first launch", "supervised": true, "started_at": "2026-12-02T03:56:33.980446985Z"}
	}
	return map[string]any{
		"episode_id":  EpisodeID{RolloutID: "soak-00042", Attempt: 0},
		"session_key": "soak-00042",
		"session":     map[string]any{"adapter": "fake", "state": json.RawMessage(`{"session_dir":"/sandbox/.ngharness/state/fake/soak-00042-a0-1"}`)},
		"boundary":    json.RawMessage("null"),
		"episode":     map[string]any{"v": 1, "next": "harness", "launches": launches, "cookies": map[string]string{"session_id": "0123456789abcdef01234567"}},
		"html":        "<a & b>",
		"indented":    indented{},
	}
}

// TestNewRecordIsCompactAndParsed: a record made by NewRecord is what
// ParseRecord makes of the same value's JSON: compact (a Marshaler's
// indented answer included), one line, HTML not escaped, its episode id
// read.
func TestNewRecordIsCompactAndParsed(t *testing.T) {
	v := benchRecord()
	r, err := NewRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	want, err := ParseRecord(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.JSON, want.JSON) || r.EpisodeID != want.EpisodeID {
		t.Fatalf("NewRecord:\n%s %v\nParseRecord of the same value:\n%s %v", r.JSON, r.EpisodeID, want.JSON, want.EpisodeID)
	}
	if bytes.ContainsAny(r.JSON, "\n ") && !strings.Contains(string(r.JSON), `"x y"`) || strings.Contains(string(r.JSON), "\n") {
		t.Fatalf("not compact: %s", r.JSON)
	}
	if !strings.Contains(string(r.JSON), `"<a & b>"`) || r.EpisodeID.RolloutID != "soak-00042" {
		t.Fatalf("record %s, episode %v", r.JSON, r.EpisodeID)
	}
	if _, err := NewRecord(map[string]any{"no_episode": 1}); err == nil {
		t.Fatalf("a record without episode_id was made")
	}
	if _, err := NewRecord([]int{1}); err == nil {
		t.Fatalf("a record that is not an object was made")
	}
}

// cpuTime is this process's user and system CPU time (getrusage): on a
// shared machine it says more than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkNewRecord: the cost of one record as a commit exports it, also
// as CPU time per record (cpu-ns/op).
func BenchmarkNewRecord(b *testing.B) {
	v := benchRecord()
	b.ReportAllocs()
	c0 := cpuTime()
	for b.Loop() {
		if _, err := NewRecord(v); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
}
