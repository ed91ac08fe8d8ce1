package driver_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/hosttest"
)

// TestReadNewestFile: on a real /bin/sh, in a folder whose name holds
// spaces, quotes, $(...) and a glob character: the newest file matching
// the glob is read (its path and content byte for byte, a content without
// a final newline and with blank lines kept), a folder or a file matching
// elsewhere is passed over, none matching reads as "" and nil, and the
// folder's name is never shell text (the $(...) touches nothing).
func TestReadNewestFile(t *testing.T) {
	sb := hosttest.New(t)
	lent := driver.LentSandbox{Sandbox: sb}
	dir := filepath.Join(sb.Dir, `a b 'q' "dq" $(touch pwned) *`)
	ctx := context.Background()
	if file, data, err := driver.ReadNewestFile(ctx, lent, dir, "projects/*/*.jsonl"); err != nil || file != "" || data != nil {
		t.Fatalf("no folder: %q %q %v", file, data, err)
	}
	write := func(rel, content string, age time.Duration) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("projects/old/x.jsonl", "old\n", time.Hour)
	newest := write("projects/new dir/y.jsonl", "{\"a\":1}\n\n{\"b\":2}", time.Minute)
	write("projects/newer.jsonl", "not below a project folder", 0)
	write("other/z.jsonl", "not matching", 0)
	if err := os.MkdirAll(filepath.Join(dir, "projects", "p", "d.jsonl"), 0o755); err != nil {
		t.Fatal(err)
	}
	file, data, err := driver.ReadNewestFile(ctx, lent, dir, "projects/*/*.jsonl")
	if err != nil || file != newest || string(data) != "{\"a\":1}\n\n{\"b\":2}" {
		t.Errorf("newest: %q %q %v; want %q", file, data, err, newest)
	}
	if _, err := os.Stat(filepath.Join(sb.Workdir(), "pwned")); err == nil {
		t.Error("the folder's name ran as shell text")
	}
	if file, data, err := driver.ReadNewestFile(ctx, lent, dir, "sessions/*.jsonl"); err != nil || file != "" || data != nil {
		t.Errorf("none matching: %q %q %v", file, data, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := driver.ReadNewestFile(cancelled, lent, dir, "projects/*/*.jsonl"); err == nil || !strings.Contains(err.Error(), "projects/*/*.jsonl") {
		t.Errorf("a cancelled read: %v, want an error naming what was read", err)
	}
}

// TestReadSandboxFile: a file is read byte for byte (a name with spaces
// and quotes, a leading dash); a missing one reads as ok false and no
// error.
func TestReadSandboxFile(t *testing.T) {
	sb := hosttest.New(t)
	lent := driver.LentSandbox{Sandbox: sb}
	p := filepath.Join(sb.Dir, `-n 'q' "dq"`, "-task.txt")
	want := "-e line\n$(id) `id`\n\x01"
	if err := sb.Upload(context.Background(), p, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	data, ok, err := driver.ReadSandboxFile(context.Background(), lent, p)
	if err != nil || !ok || string(data) != want {
		t.Errorf("read %q %v %v, want %q", data, ok, err, want)
	}
	data, ok, err = driver.ReadSandboxFile(context.Background(), lent, p+".missing")
	if err != nil || ok || len(data) != 0 {
		t.Errorf("a missing file: %q %v %v", data, ok, err)
	}
}

// TestJSONLinesArray: JSON lines become one JSON array (blank lines and a
// last line cut short left out), and ArrayJSONLines gives the lines back
// one a line; null or nothing is no data, anything but an array an
// error.
func TestJSONLinesArray(t *testing.T) {
	in := "{\"a\":1}\n\n  [1,2]  \n\"s\"\n{\"cut\":"
	arr := driver.JSONLinesArray([]byte(in))
	if string(arr) != `[{"a":1},[1,2],"s"]` || !json.Valid(arr) {
		t.Errorf("array %s", arr)
	}
	if got := driver.JSONLinesArray(nil); string(got) != "[]" {
		t.Errorf("no lines: %s", got)
	}
	back, err := driver.ArrayJSONLines(arr)
	if err != nil || string(back) != "{\"a\":1}\n[1,2]\n\"s\"\n" {
		t.Errorf("back %q %v", back, err)
	}
	for _, raw := range []string{"", "null"} {
		if data, err := driver.ArrayJSONLines(json.RawMessage(raw)); data != nil || err != nil {
			t.Errorf("%q: %q %v", raw, data, err)
		}
	}
	if _, err := driver.ArrayJSONLines(json.RawMessage(`{"a":1}`)); err == nil || !strings.Contains(err.Error(), "not a list of lines") {
		t.Errorf("an object: %v", err)
	}
}
