package gym

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestEveryRouteIsServed: the handler serves each row of the routes table
// at its method and no other (405 naming the method), refuses a body field
// the row does not list (422 naming it, after the token), and takes the
// fields it lists; an op the table does not have is 404.
func TestEveryRouteIsServed(t *testing.T) {
	_, s := serve(t)
	if st, _ := call(t, s, "POST", "checkpoint", "secret", "{}"); st != http.StatusNotFound {
		t.Errorf("an op not in the table = %d, want 404", st)
	}
	for _, r := range routes {
		other := http.MethodGet
		if r.method == http.MethodGet {
			other = http.MethodPost
		}
		req, err := http.NewRequest(other, s.URL+RoutePrefix+"/"+r.op, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != r.method {
			t.Errorf("%s %s = %d Allow %q, want 405 Allow %s", other, r.op, resp.StatusCode, resp.Header.Get("Allow"), r.method)
		}
		if r.method == http.MethodGet {
			if st, _ := call(t, s, r.method, r.op, "secret", ""); st != http.StatusOK {
				t.Errorf("GET %s = %d", r.op, st)
			}
			continue
		}
		st, v := call(t, s, r.method, r.op, "secret", `{"checkpoint_id":"c","deadline_ts":1,"surprise":1}`)
		if st != http.StatusUnprocessableEntity || !strings.Contains(detailOf(v), "surprise") {
			t.Errorf("%s with an unknown field = %d %v, want 422 naming it", r.op, st, v)
		}
		for _, f := range r.fields {
			st, v := call(t, s, r.method, r.op, "secret", `{"checkpoint_id":"c","deadline_ts":1,"`+f+`":null}`)
			if st == http.StatusUnprocessableEntity && strings.Contains(detailOf(v), "unknown field") {
				t.Errorf("%s refuses its own field %s: %v", r.op, f, v)
			}
		}
	}
}

// detailOf is the text of a 422's first issue.
func detailOf(v map[string]any) string {
	d, _ := v["detail"].([]any)
	if len(d) == 0 {
		return ""
	}
	issue, _ := d[0].(map[string]any)
	msg, _ := issue["msg"].(string)
	return msg
}

// TestDocsRouteTable: docs/gym.md's table of the checkpoint routes lists
// the routes of the table, in its order, each at its method and with the
// body fields it takes.
func TestDocsRouteTable(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "gym.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "| route | body | reply |\n|---|---|---|\n")
	if !ok {
		t.Fatal("docs/gym.md has no table of the routes")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	row := regexp.MustCompile("^\\| `([A-Z]+) ([a-z]+)` \\| ([^|]*) \\|")
	code := regexp.MustCompile("`([^`]*)`")
	word := regexp.MustCompile(`[a-z_]+`)
	var listed []string
	for _, line := range strings.Split(table, "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("docs/gym.md: %q is not a row of the route table", line)
			continue
		}
		method, op, body := m[1], m[2], m[3]
		listed = append(listed, op)
		r := routeOf[op]
		if r == nil {
			t.Errorf("docs/gym.md lists %s %s, which the table does not have", method, op)
			continue
		}
		if method != r.method {
			t.Errorf("docs/gym.md: %s at %s, the table at %s", op, method, r.method)
		}
		var fields []string
		for _, c := range code.FindAllStringSubmatch(body, -1) {
			for _, w := range word.FindAllString(c[1], -1) {
				if w != "checkpoint_id" && w != "deadline_ts" {
					fields = append(fields, w)
				}
			}
		}
		if !slices.Equal(fields, r.fields) {
			t.Errorf("docs/gym.md: the body of %s has %v, the table %v", op, fields, r.fields)
		}
	}
	if !slices.Equal(listed, Ops()) {
		t.Errorf("docs/gym.md lists %v, the table has %v", listed, Ops())
	}
}
