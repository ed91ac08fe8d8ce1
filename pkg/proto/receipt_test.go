package proto

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// fullReceipt has every field set to a value that differs from its zero
// value, so a field lost on the way shows up.
func fullReceipt() *Receipt {
	return &Receipt{
		Version:              ReceiptVersion,
		ID:                   "rollout-7.attempt_2:a@b+c=d",
		Command:              []string{"/bin/sh", "-c", "echo 'hi there'; exit 3", ""},
		SupervisorPID:        4242,
		SupervisorStartTicks: 123456789012,
		Started:              true,
		HarnessPID:           4243,
		HarnessPGID:          4244,
		HarnessStartTicks:    123456789099,
		Cgroup:               "/sys/fs/cgroup/freezer/ngsup-x-4242",
		CgroupVersion:        1,
		StartedAt:            time.Date(2025, 3, 4, 5, 6, 7, 891011121, time.UTC),
		EndedAt:              time.Date(2025, 3, 4, 6, 7, 8, 1, time.UTC),
		Ended:                true,
		ExitCode:             137,
		Signal:               9,
		TimedOut:             true,
		CleanupConfirmed:     true,
		Error:                "processes were left: \"quoted\"\tand\ttabs",
	}
}

// assertSameReceipt compares two receipts field by field: times by instant
// (msgpack does not carry a time's location), everything else exactly.
func assertSameReceipt(t testing.TB, want, got *Receipt) {
	t.Helper()
	if diff := receiptDiff(want, got); diff != "" {
		t.Fatalf("receipt changed on the way: %s", diff)
	}
}

// receiptDiff names the first field that differs, "" when none does.
func receiptDiff(want, got *Receipt) string {
	if !want.StartedAt.Equal(got.StartedAt) {
		return "StartedAt: want " + want.StartedAt.String() + ", got " + got.StartedAt.String()
	}
	if !want.EndedAt.Equal(got.EndedAt) {
		return "EndedAt: want " + want.EndedAt.String() + ", got " + got.EndedAt.String()
	}
	a, b := *want, *got
	a.StartedAt, b.StartedAt = time.Time{}, time.Time{}
	a.EndedAt, b.EndedAt = time.Time{}, time.Time{}
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := 0; i < va.NumField(); i++ {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			return va.Type().Field(i).Name + ": want " + sprint(va.Field(i).Interface()) + ", got " + sprint(vb.Field(i).Interface())
		}
	}
	return ""
}

func sprint(v any) string { return fmt.Sprintf("%#v", v) }

func TestReceiptFieldsAllSet(t *testing.T) {
	// Guard for the round-trip tests: a field added to Receipt later must be
	// set in fullReceipt, or its loss would go unseen.
	v := reflect.ValueOf(*fullReceipt())
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).IsZero() {
			t.Errorf("fullReceipt leaves %s at its zero value", v.Type().Field(i).Name)
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	want := fullReceipt()
	data, err := EncodeReceipt(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeReceipt(data)
	if err != nil {
		t.Fatalf("decode a receipt just encoded: %v", err)
	}
	assertSameReceipt(t, want, got)
}

func TestEncodeDecodeRoundTripMinimal(t *testing.T) {
	// A receipt as the supervisor writes it first: not started, no times.
	want := &Receipt{Version: ReceiptVersion, ID: "x", SupervisorPID: 1, ExitCode: -1}
	data, err := EncodeReceipt(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeReceipt(data)
	if err != nil {
		t.Fatal(err)
	}
	assertSameReceipt(t, want, got)
	if !got.StartedAt.IsZero() || !got.EndedAt.IsZero() {
		t.Fatalf("zero times came back as %v and %v", got.StartedAt, got.EndedAt)
	}
}

func TestWriteReadReceiptRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := fullReceipt()
	want.Version = 0 // WriteReceipt stamps the version itself
	if err := WriteReceipt(dir, want); err != nil {
		t.Fatal(err)
	}
	if want.Version != ReceiptVersion {
		t.Fatalf("WriteReceipt left version %d, want %d", want.Version, ReceiptVersion)
	}
	got, err := ReadReceipt(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertSameReceipt(t, want, got)

	// A second write replaces the first whole.
	want.Ended, want.ExitCode, want.Error = false, 0, ""
	if err := WriteReceipt(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err = ReadReceipt(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertSameReceipt(t, want, got)
	assertOnlyFiles(t, dir, ReceiptFile)
}

func TestReadReceiptMissing(t *testing.T) {
	dir := t.TempDir()
	_, err := ReadReceipt(dir)
	if !errors.Is(err, ErrNoLaunch) {
		t.Fatalf("ReadReceipt of an empty folder: got %v, want ErrNoLaunch", err)
	}
	if !strings.Contains(err.Error(), dir) {
		t.Fatalf("error %q does not name the folder %s", err, dir)
	}
}

func TestReadReceiptCorruptNamesFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, ReceiptFile)
	if err := os.WriteFile(path, []byte("not msgpack"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ReadReceipt(dir)
	if !errors.Is(err, ErrCorruptReceipt) {
		t.Fatalf("got %v, want ErrCorruptReceipt", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("error %q does not name the file %s", err, path)
	}
}

func mustEncode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func validReceiptBytes(t testing.TB) []byte {
	t.Helper()
	b, err := EncodeReceipt(fullReceipt())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkDecodeError asserts DecodeReceipt fails with sentinel and a message
// holding every one of words.
func checkDecodeError(t *testing.T, data []byte, sentinel error, words ...string) {
	t.Helper()
	r, err := DecodeReceipt(data)
	if err == nil {
		t.Fatalf("DecodeReceipt(%q) accepted %+v, want an error", data, r)
	}
	if r != nil {
		t.Errorf("DecodeReceipt returned a receipt along with the error %v", err)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("DecodeReceipt: error %q is not %v", err, sentinel)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("DecodeReceipt: error %q does not say %q", err, w)
		}
	}
}

func TestDecodeReceiptEmpty(t *testing.T) {
	checkDecodeError(t, nil, ErrCorruptReceipt, "empty")
	checkDecodeError(t, []byte{}, ErrCorruptReceipt, "empty")
}

func TestDecodeReceiptEveryPrefixTruncated(t *testing.T) {
	data := validReceiptBytes(t)
	for n := 1; n < len(data); n++ {
		r, err := DecodeReceipt(data[:n])
		if err == nil {
			t.Fatalf("prefix of %d of %d bytes accepted: %+v", n, len(data), r)
		}
		if !errors.Is(err, ErrCorruptReceipt) {
			t.Fatalf("prefix of %d bytes: error %q is not ErrCorruptReceipt", n, err)
		}
		if !strings.Contains(err.Error(), "truncated") {
			t.Fatalf("prefix of %d bytes: error %q does not say truncated", n, err)
		}
	}
}

func TestDecodeReceiptGarbage(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"text", []byte("hello, this is not a receipt\n")},
		{"json", []byte(`{"v":1,"id":"x","supervisor_pid":1}`)},
		{"nul bytes", make([]byte, 64)},
		{"0xc1 never used", []byte{0xc1, 0xc1, 0xc1}},
		{"msgpack string", mustEncode(t, "a receipt")},
		{"msgpack int", mustEncode(t, 1)},
		{"msgpack nil", []byte{0xc0}},
		{"map with a non-string key", []byte{0x81, 0x01, 0x01}},
		{"version of the wrong type", mustEncode(t, map[string]any{"v": 1, "id": 5, "supervisor_pid": 1})},
		{"high bytes", bytes.Repeat([]byte{0xff, 0xfe, 0xdd}, 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeReceipt(tc.data)
			if err == nil {
				t.Fatalf("garbage %q accepted", tc.data)
			}
			if !errors.Is(err, ErrCorruptReceipt) && !errors.Is(err, ErrUnknownVersion) {
				t.Fatalf("garbage %q: error %q is neither corrupt nor unknown version", tc.data, err)
			}
			if !strings.HasPrefix(err.Error(), ErrCorruptReceipt.Error()+": ") || len(err.Error()) <= len(ErrCorruptReceipt.Error())+2 {
				t.Fatalf("garbage %q: error %q does not say what is wrong", tc.data, err)
			}
		})
	}
}

func TestDecodeReceiptUnknownVersion(t *testing.T) {
	r := fullReceipt()
	r.Version = 99
	checkDecodeError(t, mustEncode(t, r), ErrUnknownVersion, "99", "reads 1")
	if errors.Is(mustDecodeErr(t, mustEncode(t, r)), ErrCorruptReceipt) {
		t.Fatal("an unknown version is reported as a corrupt receipt too")
	}
	// A future format that changed other fields is still a version problem.
	future := map[string]any{"v": 2, "id": []int{1, 2}, "supervisor_pid": "new-shape"}
	checkDecodeError(t, mustEncode(t, future), ErrUnknownVersion, "version 2")
	// Version 0 (never written) and a negative one.
	r.Version = 0
	checkDecodeError(t, mustEncode(t, r), ErrUnknownVersion, "version 0")
	r.Version = -5
	checkDecodeError(t, mustEncode(t, r), ErrUnknownVersion, "version -5")
}

func mustDecodeErr(t *testing.T, data []byte) error {
	t.Helper()
	_, err := DecodeReceipt(data)
	if err == nil {
		t.Fatal("accepted")
	}
	return err
}

func TestDecodeReceiptNoVersion(t *testing.T) {
	noV := map[string]any{"id": "x", "supervisor_pid": 5, "started": false}
	checkDecodeError(t, mustEncode(t, noV), ErrCorruptReceipt, "version")
	nilV := map[string]any{"v": nil, "id": "x", "supervisor_pid": 5}
	checkDecodeError(t, mustEncode(t, nilV), ErrCorruptReceipt, "version")
	strV := map[string]any{"v": "1", "id": "x", "supervisor_pid": 5}
	checkDecodeError(t, mustEncode(t, strV), ErrCorruptReceipt, "version")
	checkDecodeError(t, mustEncode(t, map[string]any{}), ErrCorruptReceipt, "version")
}

func TestDecodeReceiptTrailingGarbage(t *testing.T) {
	data := validReceiptBytes(t)
	checkDecodeError(t, append(bytes.Clone(data), "xyz"...), ErrCorruptReceipt, "3 bytes", "trailing")
	checkDecodeError(t, append(bytes.Clone(data), data...), ErrCorruptReceipt, "trailing")
	checkDecodeError(t, append(bytes.Clone(data), 0), ErrCorruptReceipt, "1 bytes", "trailing")
}

func TestDecodeReceiptInvalidID(t *testing.T) {
	for _, tc := range []struct{ id, says string }{
		{"a/b", "slash"},
		{"", "empty"},
		{".hidden", "dot"},
		{"tab\there", "character"},
		{strings.Repeat("a", MaxIDLen+1), "limit"},
	} {
		r := fullReceipt()
		r.ID = tc.id
		checkDecodeError(t, mustEncode(t, r), ErrCorruptReceipt, tc.says)
	}
}

func TestDecodeReceiptStartedWithoutHarness(t *testing.T) {
	r := fullReceipt()
	r.HarnessPID = 0
	checkDecodeError(t, mustEncode(t, r), ErrCorruptReceipt, "started", "harness pid 0")
	r = fullReceipt()
	r.HarnessPGID = 0
	checkDecodeError(t, mustEncode(t, r), ErrCorruptReceipt, "started", "pgid 0")
	r = fullReceipt()
	r.HarnessPID = -3
	checkDecodeError(t, mustEncode(t, r), ErrCorruptReceipt, "harness pid -3")
	// Not started: no harness is fine.
	r = fullReceipt()
	r.Started, r.HarnessPID, r.HarnessPGID = false, 0, 0
	if _, err := DecodeReceipt(mustEncode(t, r)); err != nil {
		t.Fatalf("a receipt not started, with no harness, rejected: %v", err)
	}
}

func TestDecodeReceiptNoSupervisor(t *testing.T) {
	r := fullReceipt()
	r.SupervisorPID = 0
	checkDecodeError(t, mustEncode(t, r), ErrCorruptReceipt, "supervisor pid 0")
}

func TestDecodeReceiptFieldOfWrongType(t *testing.T) {
	m := map[string]any{"v": 1, "id": "x", "supervisor_pid": "not a number"}
	checkDecodeError(t, mustEncode(t, m), ErrCorruptReceipt)
}

func TestDecodeReceiptIgnoresUnknownFields(t *testing.T) {
	// An added field from a compatible writer does not make it corrupt.
	m := map[string]any{"v": 1, "id": "x", "supervisor_pid": 7, "added_later": []string{"a"}}
	r, err := DecodeReceipt(mustEncode(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != "x" || r.SupervisorPID != 7 {
		t.Fatalf("decoded %+v", r)
	}
}

// assertOnlyFiles fails if dir holds anything but names (a temp file left
// behind by an atomic write, say).
func assertOnlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !reflect.DeepEqual(got, names) {
		t.Fatalf("%s holds %q, want only %q", dir, got, names)
	}
}

func TestWriteFileAtomicNoTempLeft(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	for i, content := range []string{"first", "second, longer than the first", ""} {
		if err := WriteFileAtomic(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != content {
			t.Fatalf("write %d: read back %q, want %q", i, got, content)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
		}
		assertOnlyFiles(t, dir, "f")
	}
	if err := ReplaceFile(path, []byte("fast"), 0o644); err != nil {
		t.Fatal(err)
	}
	assertOnlyFiles(t, dir, "f")
}

func TestWriteFileAtomicReplacesByRename(t *testing.T) {
	// A reader that opened the old file keeps reading the old content whole,
	// and the path names a new inode: the file was replaced, not rewritten in
	// place (an in-place write could be seen half done).
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	old := bytes.Repeat([]byte("old "), 4096)
	if err := WriteFileAtomic(path, old, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(path, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if os.SameFile(before, after) {
		t.Fatal("the file was rewritten in place, not replaced")
	}
	held, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(held, old) {
		t.Fatalf("an open reader saw %d bytes of a changed file", len(held))
	}
	got, _ := os.ReadFile(path)
	if string(got) != "new" {
		t.Fatalf("read %q", got)
	}
	assertOnlyFiles(t, dir, "f")
}

func TestWriteFileAtomicFailureKeepsOld(t *testing.T) {
	// A folder that does not exist: the error names the path; and a path
	// that is a folder: the rename fails, the temp file is removed and the
	// folder is untouched.
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-such-folder", "f")
	err := WriteFileAtomic(missing, []byte("x"), 0o644)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("write into a missing folder: %v", err)
	}
	target := filepath.Join(dir, "d")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "keep"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(target, []byte("x"), 0o644); err == nil {
		t.Fatal("replacing a non-empty folder with a file succeeded")
	}
	assertOnlyFiles(t, dir, "d")
	assertOnlyFiles(t, target, "keep")
}

func TestWriteReceiptKeepsOldOnEncodeOrWriteFailure(t *testing.T) {
	// Writing into a folder that is gone fails without touching anything
	// else; the old receipt elsewhere is intact.
	dir := t.TempDir()
	r := fullReceipt()
	if err := WriteReceipt(dir, r); err != nil {
		t.Fatal(err)
	}
	if err := WriteReceipt(filepath.Join(dir, "gone"), r); err == nil {
		t.Fatal("write into a missing folder succeeded")
	}
	got, err := ReadReceipt(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertSameReceipt(t, r, got)
}

// TestDecodeReceiptHugeLengthHeaders: a few bytes whose length headers claim
// gigabytes are rejected without allocating what they claim. Before the
// framing check, msgpack allocated the claimed length up front: an 8-byte
// file made DecodeReceipt take 4 GiB (found by FuzzDecodeReceipt).
func TestDecodeReceiptHugeLengthHeaders(t *testing.T) {
	v := []byte{0x82, 0xa1, 'v', 0x01, 0xa2, 'i', 'd'} // {"v": 1, "id": <value>}
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"bin32 as the version", []byte{0x81, 0xa1, 'v', 0xc6, 0xff, 0xff, 0xff, 0xff}},
		{"bin32 after the version", append(bytes.Clone(v), 0xc6, 0xff, 0xff, 0xff, 0xff)},
		{"str32", append(bytes.Clone(v), 0xdb, 0xff, 0xff, 0xff, 0xff, 'a')},
		{"array32", append(bytes.Clone(v), 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01)},
		{"map32", append(bytes.Clone(v), 0xdf, 0xff, 0xff, 0xff, 0xff, 0x01, 0x01)},
		{"ext32", append(bytes.Clone(v), 0xc9, 0xff, 0xff, 0xff, 0xff, 0xff)},
		{"map32 at the top", []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'v', 0x01}},
		{"the fuzzer's input", []byte("\xde\x00\x13\xa1v\xc6\x98\x8c\xa5\xa5ended\xc3")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := DecodeReceipt(tc.data)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrCorruptReceipt) || !strings.Contains(err.Error(), "truncated") {
				t.Fatalf("got %v, want a truncated corrupt receipt", err)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
				t.Fatalf("decoding %d bytes allocated %d bytes", len(tc.data), grew)
			}
		})
	}
}

func TestDecodeReceiptNesting(t *testing.T) {
	nested := func(levels int) []byte {
		b := []byte{0x84, 0xa1, 'v', 0x01, 0xa2, 'i', 'd', 0xa1, 'x', 0xae}
		b = append(b, "supervisor_pid"...)
		b = append(b, 0x05, 0xa5)
		b = append(b, "extra"...)
		for range levels {
			b = append(b, 0x91)
		}
		return append(b, 0xc0)
	}
	// An unknown field nested a little is a compatible addition.
	r, err := DecodeReceipt(nested(10))
	if err != nil {
		t.Fatalf("10 levels of nesting in an unknown field: %v", err)
	}
	if r.ID != "x" || r.SupervisorPID != 5 {
		t.Fatalf("decoded %+v", r)
	}
	// Deep nesting is refused before msgpack recurses into it.
	checkDecodeError(t, nested(100000), ErrCorruptReceipt, "nested more than")
}

func TestDecodeReceiptNotAMap(t *testing.T) {
	for _, data := range [][]byte{{0xc0}, {0x01}, {0x91, 0x01}, []byte("\xa5hello")} {
		checkDecodeError(t, data, ErrCorruptReceipt, "not a msgpack map", fmt.Sprintf("%#02x", data[0]))
	}
	checkDecodeError(t, []byte{0x81, 0xa1, 'v', 0xc1}, ErrCorruptReceipt, "0xc1 at offset 3")
}

// TestDecodeReceiptRepeatedVersionKey: a map that holds "v" twice made
// msgpack panic (decoding the second value into the interface the first had
// filled; found by FuzzDecodeReceipt). The last value counts, as it does for
// every other field.
func TestDecodeReceiptRepeatedVersionKey(t *testing.T) {
	// The fuzzer's input, minimized: {"v": 48, "v": "0000..."}.
	checkDecodeError(t, []byte("\x82\xa1v0\xa1v\xa40000"), ErrCorruptReceipt, "no format version")
	checkDecodeError(t, []byte("\xde\x00\x13\xa1v0\xa1v00000000000000000000000000000000000"), ErrCorruptReceipt)
	twice := func(first, last int) []byte {
		b := []byte{0x84, 0xa1, 'v', byte(first), 0xa2, 'i', 'd', 0xa1, 'x', 0xae}
		b = append(b, "supervisor_pid"...)
		return append(b, 0x05, 0xa1, 'v', byte(last))
	}
	r, err := DecodeReceipt(twice(1, 1))
	if err != nil || r.Version != 1 || r.ID != "x" {
		t.Fatalf("v twice, both 1: %+v, %v", r, err)
	}
	checkDecodeError(t, twice(1, 99), ErrUnknownVersion, "version 99")
	if r, err := DecodeReceipt(twice(99, 1)); err != nil || r.Version != 1 {
		t.Fatalf("v 99 then 1: %+v, %v; the last value counts", r, err)
	}
}
