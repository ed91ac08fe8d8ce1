package fakeexecd_test

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/test/fakeexecd"
)

// TestFakeIsStrictWhereExecdIs proves the fake refuses what the real
// services refuse, so a client passing against it does it right: a
// lifecycle call without the API key (401), an execd call without the
// access token the endpoint lookup names (401), and an upload whose
// metadata is a plain form field instead of a file part (400).
func TestFakeIsStrictWhereExecdIs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	srv, err := fakeexecd.Start(fakeexecd.Options{Base: t.TempDir(), APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	call := func(method, url, key string, body io.Reader, header map[string]string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, url, body)
		if key != "" {
			req.Header.Set(fakeexecd.APIKeyHeader, key)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, data
	}
	resp, _ := call("POST", srv.URL()+"/v1/sandboxes", "", strings.NewReader(`{"image":{"uri":"x"}}`), nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no API key: %d", resp.StatusCode)
	}
	resp, data := call("POST", srv.URL()+"/v1/sandboxes", "k", strings.NewReader(`{"image":{"uri":"x"}}`), nil)
	var sb struct{ ID string }
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(data, &sb) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, data)
	}
	resp, data = call("GET", srv.URL()+"/v1/sandboxes/"+sb.ID+"/endpoints/44772", "k", nil, nil)
	var ep struct {
		Endpoint string
		Headers  map[string]string
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &ep) != nil {
		t.Fatalf("endpoint: %d %s", resp.StatusCode, data)
	}
	resp, _ = call("GET", "http://"+ep.Endpoint+"/ping", "", nil, nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("execd without its token: %d", resp.StatusCode)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("metadata", `{"path":"/sandbox/work/f","mode":644}`)
	fw, _ := mw.CreateFormFile("file", "f")
	fw.Write([]byte("x"))
	mw.Close()
	resp, data = call("POST", "http://"+ep.Endpoint+"/files/upload", "", &body,
		map[string]string{"Content-Type": mw.FormDataContentType(), fakeexecd.AccessTokenHeader: ep.Headers[fakeexecd.AccessTokenHeader]})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), "file part") {
		t.Errorf("metadata as a plain field: %d %s", resp.StatusCode, data)
	}
}
