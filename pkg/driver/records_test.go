package driver_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver"
)

// someRecords are two runs as a commit exports them.
func someRecords() []driver.Record {
	return []driver.Record{
		{RolloutID: "r-1", Attempt: 1, Bookmark: []byte(`{"v":1,"next":"seed"}`)},
		{RolloutID: "r-2", Attempt: 2, Bookmark: []byte(`{"v":1,"next":"verify","response":{"text":"done"}}`)},
	}
}

// wantBadRecords fails unless err is ErrBadRecords naming every word.
func wantBadRecords(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if !errors.Is(err, driver.ErrBadRecords) {
		t.Errorf("%s: got %v, want an ErrBadRecords error", what, err)
		return
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: the error %q does not name %q", what, err, w)
		}
	}
}

// TestRecordsMissingOrIncompleteAreRefused proves that a restore never reads
// nothing silently. A commit that died while writing its records leaves only
// the temporary file (the driver was SIGKILLed mid-write): reading the
// checkpoint for that participant fails naming its records file (it once
// returned 0 records and no error). So does a checkpoint the participant
// never wrote, every strict prefix of a whole file (truncated anywhere),
// garbage, and a whole-looking file whose content was changed (its end
// line's SHA-256 no longer matches). A good file reads back the same runs,
// and a checkpoint that legitimately exported no run reads back 0 runs.
func TestRecordsMissingOrIncompleteAreRefused(t *testing.T) {
	const me, ck = "drv-a", "ck-1"
	dir := t.TempDir()

	// Good, and empty.
	path, err := driver.WriteRecords(dir, me, ck, someRecords())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := driver.ReadRecords(dir, me, ck); err != nil || len(got) != 2 || got[1].RolloutID != "r-2" || got[1].Attempt != 2 {
		t.Fatalf("a good records file reads back %+v, %v", got, err)
	}
	empty := t.TempDir()
	if _, err := driver.WriteRecords(empty, me, ck, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := driver.ReadRecords(empty, me, ck); err != nil || len(got) != 0 {
		t.Errorf("a checkpoint that exported no run reads back %v, %v; want 0 runs and no error", got, err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	// Only the temporary file of a commit that died while writing it.
	died := t.TempDir()
	want := driver.RecordsPath(died, me)
	os.MkdirAll(filepath.Dir(want), 0o755)
	tmp := filepath.Join(filepath.Dir(want), "."+filepath.Base(want)+".tmp-123456")
	if err := os.WriteFile(tmp, good[:len(good)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = driver.ReadRecords(died, me, ck)
	wantBadRecords(t, "only the temporary file", err, want, "temporary", "died")

	// Nothing written by this participant (another one's file is there).
	other := t.TempDir()
	if _, err := driver.WriteRecords(other, "drv-b", ck, someRecords()[:1]); err != nil {
		t.Fatal(err)
	}
	_, err = driver.ReadRecords(other, me, ck)
	wantBadRecords(t, "no file of this participant", err, driver.RecordsPath(other, me))

	// Every strict prefix of the good file, and garbage.
	write := func(data []byte) string {
		d := t.TempDir()
		p := driver.RecordsPath(d, me)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for cut := 0; cut < len(good); cut++ {
		d := write(good[:cut])
		if recs, err := driver.ReadRecords(d, me, ck); !errors.Is(err, driver.ErrBadRecords) || !strings.Contains(err.Error(), driver.RecordsPath(d, me)) {
			t.Fatalf("the file cut at byte %d of %d: got %d runs, %v; want an error naming the file", cut, len(good), len(recs), err)
		}
	}
	for name, data := range map[string][]byte{
		"garbage":     []byte("\x00\x01not records at all\n"),
		"json array":  []byte("[1,2,3]\n"),
		"other lines": bytes.ReplaceAll(good, []byte(`"r-2"`), []byte(`"r-3"`)),
	} {
		d := write(data)
		_, err := driver.ReadRecords(d, me, ck)
		wantBadRecords(t, name, err, driver.RecordsPath(d, me))
	}
}
