package lending

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
)

// runBody is what the lending owner reads from a run body; the body's other
// fields are the framework's and are left as they are.
type runBody struct {
	RolloutID  string
	Task       string
	Check      string
	Files      map[string]string
	Restart    bool
	NoSandbox  bool
	VerifyMode string
}

// jsonObject decodes body as a JSON object, keeping every field; the
// error says what body is instead ("invalid JSON (...)", "null (...)",
// "not a JSON object (...)").
func jsonObject(body json.RawMessage) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		kind := "invalid JSON"
		if err == nil {
			kind = "null"
		} else if t := strings.TrimSpace(string(body)); t != "" && t[0] != '{' {
			kind = "not a JSON object"
		}
		return nil, fmt.Errorf("%s (%.80q)", kind, body)
	}
	return m, nil
}

// field decodes m[key] into out when present (and not null), naming the
// field and the wanted type when it does not fit.
func field(m map[string]json.RawMessage, key, want string, out any) error {
	raw, ok := m[key]
	if !ok || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("field %q must be %s, got %.80s", key, want, raw)
	}
	return nil
}

// parseRunBody reads the owner's fields of a run body; an error wraps
// ErrBadRunBody and says what is wrong.
func parseRunBody(body json.RawMessage) (runBody, error) {
	m, err := jsonObject(body)
	if err != nil {
		return runBody{}, fmt.Errorf("owner: %w: %v", ErrBadRunBody, err)
	}
	var rb runBody
	for _, f := range []struct {
		key, want string
		out       any
	}{
		{"rollout_id", "a string", &rb.RolloutID},
		{"task", "a string", &rb.Task},
		{"check", "a string", &rb.Check},
		{"files", "an object of strings (relative path: content)", &rb.Files},
		{"restart", "a boolean", &rb.Restart},
		{"no_sandbox", "a boolean", &rb.NoSandbox},
		{"verify_mode", `"replay" or ""`, &rb.VerifyMode},
	} {
		if err := field(m, f.key, f.want, f.out); err != nil {
			return runBody{}, fmt.Errorf("owner: %w: %v", ErrBadRunBody, err)
		}
	}
	if rb.VerifyMode != "" && rb.VerifyMode != "replay" {
		return runBody{}, fmt.Errorf(`owner: %w: field "verify_mode" must be "replay" or "", got %q`, ErrBadRunBody, rb.VerifyMode)
	}
	for p := range rb.Files {
		if err := checkFilePath(p); err != nil {
			return runBody{}, err
		}
	}
	return rb, nil
}

// checkFilePath accepts a relative path that stays inside the workdir.
func checkFilePath(p string) error {
	if strings.IndexByte(p, 0) >= 0 || !filepath.IsLocal(p) || filepath.Clean(p) == "." {
		return fmt.Errorf("owner: %w: file %q is not a relative path inside the workdir", ErrBadRunBody, p)
	}
	return nil
}
