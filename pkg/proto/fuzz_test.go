package proto

import (
	"errors"
	"testing"
	"time"
)

// FuzzDecodeReceipt: DecodeReceipt never panics, every error it returns is
// one of the contract's two sentinels, and whatever it accepts is a valid
// receipt that re-encodes and decodes to the same value.
// `make fuzz` runs it for 30 s.
func FuzzDecodeReceipt(f *testing.F) {
	valid := []*Receipt{
		fullReceipt(),
		{Version: ReceiptVersion, ID: "x", SupervisorPID: 1, ExitCode: -1},
		{Version: ReceiptVersion, ID: "r-1", SupervisorPID: 10, SupervisorStartTicks: 99, Started: true,
			HarnessPID: 11, HarnessPGID: 11, HarnessStartTicks: 100, StartedAt: time.Unix(1700000000, 5)},
	}
	for _, r := range valid {
		data, err := EncodeReceipt(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		for _, n := range []int{1, 2, len(data) / 3, len(data) / 2, len(data) - 1} {
			f.Add(data[:n])
		}
		f.Add(append(append([]byte{}, data...), 0xc0))
	}
	bad := fullReceipt()
	bad.Version = 99
	f.Add(mustEncode(f, bad))
	f.Add(mustEncode(f, map[string]any{"id": "x", "supervisor_pid": 5}))
	f.Add(mustEncode(f, []any{1, "x", nil, 5}))
	f.Add([]byte{})
	f.Add([]byte("garbage, not msgpack"))
	f.Add([]byte{0xc1})
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})

	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeReceipt(data)
		if err != nil {
			if r != nil {
				t.Fatalf("a receipt returned along with the error %v", err)
			}
			if !errors.Is(err, ErrCorruptReceipt) && !errors.Is(err, ErrUnknownVersion) {
				t.Fatalf("error %q is neither ErrCorruptReceipt nor ErrUnknownVersion", err)
			}
			return
		}
		if r.Version != ReceiptVersion {
			t.Fatalf("accepted version %d", r.Version)
		}
		if err := ValidateID(r.ID); err != nil {
			t.Fatalf("accepted a bad id: %v", err)
		}
		if r.SupervisorPID <= 0 || r.Started && (r.HarnessPID <= 0 || r.HarnessPGID <= 0) {
			t.Fatalf("accepted an invalid receipt %+v", r)
		}
		again, err := EncodeReceipt(r)
		if err != nil {
			t.Fatalf("re-encode an accepted receipt: %v", err)
		}
		r2, err := DecodeReceipt(again)
		if err != nil {
			t.Fatalf("decode a re-encoded receipt: %v", err)
		}
		if diff := receiptDiff(r, r2); diff != "" {
			t.Fatalf("re-encoding changed the receipt: %s", diff)
		}
	})
}
