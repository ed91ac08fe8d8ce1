package proto

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateIDAllowed(t *testing.T) {
	for _, id := range []string{
		"a",
		"0",
		"rollout-17",
		"A.b_c-d:e@f+g=h",
		"trailing.",
		"a..b",
		"-leading-dash",
		"_x",
		strings.Repeat("z", MaxIDLen),
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:@+=",
	} {
		if err := ValidateID(id); err != nil {
			t.Errorf("ValidateID(%q) = %v, want nil", id, err)
		}
	}
}

func TestValidateIDRejected(t *testing.T) {
	for _, tc := range []struct{ id, says string }{
		{"", "empty"},
		{"a/b", "slash"},
		{"/", "slash"},
		{"../etc", "dot"},
		{".", "dot"},
		{".hidden", "dot"},
		{strings.Repeat("a", MaxIDLen+1), "201 bytes"},
		{"tab\tin", `'\t'`},
		{"nl\n", `'\n'`},
		{"nul\x00", `'\x00'`},
		{"esc\x1b[31m", `'\x1b'`},
		{"del\x7f", `'\x7f'`},
		{"a b", `' '`},
		{"semi;rm", `';'`},
		{"quote'", `'\''`},
		{"dollar$x", `'$'`},
		{"star*", `'*'`},
		{"back\\slash", `'\\'`},
		{"comma,", `','`},
		{"pct%", `'%'`},
		{"é", "byte 0"},
		{"ok\u00a0", "byte 2"},
	} {
		err := ValidateID(tc.id)
		if !errors.Is(err, ErrBadID) {
			t.Errorf("ValidateID(%q) = %v, want ErrBadID", tc.id, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("ValidateID(%q) = %q, does not say %q", tc.id, err, tc.says)
		}
	}
}

func TestValidateIDEveryByte(t *testing.T) {
	// Exactly letters, digits and . _ - : @ + = pass in the middle of an id.
	allowed := "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:@+="
	for c := 0; c < 256; c++ {
		id := "a" + string([]byte{byte(c)}) + "b"
		err := ValidateID(id)
		want := strings.IndexByte(allowed, byte(c)) >= 0
		if (err == nil) != want {
			t.Errorf("byte %#x: ValidateID(%q) = %v, allowed %v", c, id, err, want)
		}
	}
}

func TestValidateDir(t *testing.T) {
	for _, tc := range []struct{ in, says string }{
		{"", "required"},
		{"relative/path", `"relative/path" is not an absolute path`},
		{".", `"." is not an absolute path`},
		{"./x", "not an absolute path"},
		{"~/x", "not an absolute path"},
	} {
		got, err := ValidateDir(tc.in)
		if !errors.Is(err, ErrBadDir) {
			t.Errorf("ValidateDir(%q) = %q, %v; want ErrBadDir", tc.in, got, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("ValidateDir(%q) = %q, does not say %q", tc.in, err, tc.says)
		}
		if got != "" {
			t.Errorf("ValidateDir(%q) returned %q along with an error", tc.in, got)
		}
	}
	for in, want := range map[string]string{
		"/":             "/",
		"/a/b":          "/a/b",
		"/a/b/":         "/a/b",
		"/a//b/./c/../": "/a/b",
	} {
		got, err := ValidateDir(in)
		if err != nil || got != want {
			t.Errorf("ValidateDir(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
