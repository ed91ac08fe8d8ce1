package e2e

// The test controller: the checkpoint control plane spoken as the rollout
// framework speaks it (shared/notes/gym-protocols.md), to the driver and to
// the owner. POST /ng-control/v1/checkpoint/<call> with Authorization:
// Bearer; bodies {checkpoint_id, deadline_ts}, commit adds checkpoint_dir,
// episode_ids and stop, restore is {checkpoint_id, checkpoint_dir,
// episode_ids}.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// controller calls one participant's control plane.
type controller struct {
	name  string // "driver" or "owner", for messages
	url   string
	token string
}

// ctlReply is a control call's answer.
type ctlReply struct {
	call   string
	status int
	body   []byte
}

func (r ctlReply) String() string {
	return fmt.Sprintf("%s: HTTP %d %s", r.call, r.status, bytes.TrimSpace(r.body))
}

// errorText is the "error" of a failed call's JSON body.
func (r ctlReply) errorText() string {
	var e struct {
		Error string `json:"error"`
	}
	json.Unmarshal(r.body, &e)
	return e.Error
}

// raw posts body (any JSON value, or a string sent as is) to the call with
// the given Authorization header ("" sends none).
func (c *controller) raw(t *testing.T, call, auth string, body any) ctlReply {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	default:
		data, _ = json.Marshal(b)
	}
	req, err := http.NewRequest(http.MethodPost, c.url+"/ng-control/v1/checkpoint/"+call, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	client := &http.Client{Timeout: waitLimit}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", c.name, call, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return ctlReply{call: c.name + " " + call, status: resp.StatusCode, body: out}
}

// call posts body with the right token.
func (c *controller) call(t *testing.T, call string, body any) ctlReply {
	t.Helper()
	return c.raw(t, call, "Bearer "+c.token, body)
}

// must posts body and fails the test unless the answer is 200.
func (c *controller) must(t *testing.T, call string, body any, out any) {
	t.Helper()
	r := c.call(t, call, body)
	if r.status != http.StatusOK {
		t.Fatalf("%s", r)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			t.Fatalf("%s: %v", r, err)
		}
	}
}

func deadline(d time.Duration) float64 {
	return float64(time.Now().Add(d).UnixNano()) / 1e9
}

// plainBody is {checkpoint_id, deadline_ts}.
func plainBody(id string) map[string]any {
	return map[string]any{"checkpoint_id": id, "deadline_ts": deadline(waitLimit)}
}

// commitBody is the commit's body.
func commitBody(id, dir string, episodes []string, stop bool) map[string]any {
	if episodes == nil {
		episodes = []string{}
	}
	return map[string]any{"checkpoint_id": id, "deadline_ts": deadline(waitLimit),
		"checkpoint_dir": dir, "episode_ids": episodes, "stop": stop}
}

// restoreBody is the restore's body.
func restoreBody(id, dir string, episodes []string) map[string]any {
	if episodes == nil {
		episodes = []string{}
	}
	return map[string]any{"checkpoint_id": id, "checkpoint_dir": dir, "episode_ids": episodes}
}

// prepared is the driver's answer to prepare.
type prepared struct {
	CheckpointID string   `json:"checkpoint_id"`
	Parked       bool     `json:"parked"`
	Records      []record `json:"records"`
	NotParked    []string `json:"not_parked"`
	ElapsedMS    int64    `json:"elapsed_ms"`
}

// record is one exported run.
type record struct {
	RolloutID string          `json:"rollout_id"`
	Attempt   int             `json:"attempt"`
	Bookmark  json.RawMessage `json:"bookmark"`
}

// bookmark is the part of a bookmark the tests read.
type bookmark struct {
	V       int               `json:"v"`
	Next    string            `json:"next"`
	Restart bool              `json:"restart"`
	Cookies map[string]string `json:"cookies"`
	State   struct {
		SessionDir string `json:"session_dir"`
	} `json:"state"`
	Resume bool `json:"resume"`
	Paused *struct {
		ID  string `json:"id"`
		Dir string `json:"dir"`
	} `json:"paused"`
	Launches []launch `json:"launches"`
}

func (r record) bookmark(t *testing.T) bookmark {
	t.Helper()
	var b bookmark
	if err := json.Unmarshal(r.Bookmark, &b); err != nil {
		t.Fatalf("the bookmark of %s is not JSON: %v: %s", r.RolloutID, err, r.Bookmark)
	}
	return b
}

// checkpoint is one committed checkpoint as the test controller ran it.
type checkpoint struct {
	id, dir string
	prep    prepared
	// paused maps each rollout exported with its launch paused in place.
	paused map[string]bool
}

// prepareCommit runs a checkpoint's first half the framework's way: driver
// prepare (every run parks), driver commit (the records are written), owner
// commit (the owner snapshots its sandboxes). Resume is the caller's.
func (e *env) prepareCommit(id string) checkpoint {
	t := e.t
	t.Helper()
	ck := checkpoint{id: id, dir: filepath.Join(e.dir, "checkpoints", id), paused: map[string]bool{}}
	e.ctl.must(t, "prepare", plainBody(id), &ck.prep)
	if !ck.prep.Parked || len(ck.prep.NotParked) != 0 {
		t.Fatalf("prepare %s: not every run parked: %+v", id, ck.prep)
	}
	if h := e.health(); h.Phase != "prepared" {
		t.Fatalf("after prepare the phase is %q, want prepared", h.Phase)
	}
	for _, r := range ck.prep.Records {
		b := r.bookmark(t)
		if b.V != 1 {
			t.Errorf("prepare %s: %s exported with bookmark version %d", id, r.RolloutID, b.V)
		}
		if b.Next == "harness" && b.Paused != nil {
			ck.paused[r.RolloutID] = true
		}
	}
	var com struct {
		CheckpointID string `json:"checkpoint_id"`
		Records      int    `json:"records"`
		Path         string `json:"path"`
		Stopped      bool   `json:"stopped"`
	}
	e.ctl.must(t, "commit", commitBody(id, ck.dir, nil, false), &com)
	want := filepath.Join(ck.dir, "gym", "records-"+driverName+".jsonl")
	if com.Records != len(ck.prep.Records) || com.Path != want || com.Stopped {
		t.Fatalf("commit %s answered %+v, want %d records at %s", id, com, len(ck.prep.Records), want)
	}
	if h := e.health(); h.Phase != "committed" {
		t.Fatalf("after commit the phase is %q, want committed", h.Phase)
	}
	checkRecordsFile(t, want, id, ck.prep.Records)
	var snap struct {
		Snapshots int `json:"snapshots"`
	}
	e.own.must(t, "commit", commitBody(id, ck.dir, nil, false), &snap)
	if snap.Snapshots < len(ck.paused) {
		t.Fatalf("owner commit %s took %d snapshots, fewer than the %d paused runs", id, snap.Snapshots, len(ck.paused))
	}
	return ck
}

// resume opens the checkpoint on the driver.
func (e *env) resume(id string) {
	e.t.Helper()
	var out struct {
		Resumed bool `json:"resumed"`
	}
	e.ctl.must(e.t, "resume", plainBody(id), &out)
	if !out.Resumed {
		e.t.Fatalf("resume %s did not say resumed", id)
	}
	if h := e.health(); h.Phase != "idle" {
		e.t.Fatalf("after resume the phase is %q, want idle", h.Phase)
	}
}

// recordsLine is one line of a records file, read strictly: a field the
// test does not know fails it.
type recordsLine struct {
	V            int             `json:"v"`
	Kind         string          `json:"kind"`
	CheckpointID string          `json:"checkpoint_id"`
	Participant  string          `json:"participant"`
	WrittenAt    string          `json:"written_at"`
	RolloutID    string          `json:"rollout_id"`
	Attempt      int             `json:"attempt"`
	Bookmark     json.RawMessage `json:"bookmark"`
	Count        *int            `json:"count"`
	SHA256       string          `json:"sha256"`
}

// checkRecordsFile checks a records file holds a header, exactly the
// exported runs (same bookmarks), and an end line counting them whose
// sha256 is that of every line before it.
func checkRecordsFile(t *testing.T, path, id string, want []record) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("records file: %v", err)
	}
	defer f.Close()
	var lines []recordsLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		var l recordsLine
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("%s line %d: %v: %s", path, len(lines)+1, err, sc.Text())
		}
		lines = append(lines, l)
	}
	if len(lines) != len(want)+2 {
		t.Fatalf("%s has %d lines, want a header, %d runs and an end line", path, len(lines), len(want))
	}
	h, end := lines[0], lines[len(lines)-1]
	if h.V != 1 || h.Kind != "header" || h.CheckpointID != id || h.Participant != driverName || h.WrittenAt == "" || h.Count == nil || *h.Count != len(want) {
		t.Errorf("%s: bad header %+v", path, h)
	}
	if end.V != 1 || end.Kind != "end" || end.Count == nil || *end.Count != len(want) {
		t.Errorf("%s: bad end line %+v", path, end)
	}
	if data, err := os.ReadFile(path); err == nil {
		body := data[:bytes.LastIndexByte(data[:len(data)-1], '\n')+1]
		if sum := sha256.Sum256(body); end.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: the end line's sha256 %q is not that of the lines before it", path, end.SHA256)
		}
	}
	for i, w := range want {
		l := lines[i+1]
		if l.V != 1 || l.Kind != "run" || l.RolloutID != w.RolloutID || l.Attempt != w.Attempt || !sameJSON(l.Bookmark, w.Bookmark) {
			t.Errorf("%s line %d: %+v, want the exported run %s attempt %d with its bookmark", path, i+2, l, w.RolloutID, w.Attempt)
		}
	}
}

func sameJSON(a, b []byte) bool {
	var x, y bytes.Buffer
	if json.Compact(&x, a) != nil || json.Compact(&y, b) != nil {
		return false
	}
	return bytes.Equal(x.Bytes(), y.Bytes())
}
