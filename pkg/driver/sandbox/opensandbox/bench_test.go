package opensandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// benchFixture is a fake OpenSandbox at real execd's timing (1 s graceful
// delay, 100 ms output polls) with one sandbox.
func benchFixture(b testing.TB) (*opensandbox.Sandbox, *opensandbox.Execd) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("the fake execd needs root")
	}
	srv, err := fakeexecd.Start(fakeexecd.Options{Base: b.TempDir(), APIKey: apiKey})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	bk, err := opensandbox.New(opensandbox.Options{Server: srv.URL(), APIKey: apiKey, Image: "x",
		Root: "/sandbox/.ngharness", Workdir: "/sandbox/work", Poll: 20 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	s, err := bk.Create(context.Background(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	sb := s.(*opensandbox.Sandbox)
	ex, err := sb.Execd(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return sb, ex
}

// execTrue is one Exec of `true` through the backend: the wrapper script,
// read up to execd's final event.
func execTrue(tb testing.TB, sb *opensandbox.Sandbox) {
	if res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		tb.Fatalf("%+v %v", res, err)
	}
}

// oldExecTrue is what an exec of `true` cost before (the backend as it
// was): `timeout -s KILL` around the line, the stream read until execd
// closed it.
func oldExecTrue(tb testing.TB, sb *opensandbox.Sandbox, ex *opensandbox.Execd) {
	line, _ := sandbox.CommandLine(sandbox.ExecRequest{Argv: []string{"true"}, Dir: sb.Workdir()})
	q := sandbox.Quote(line)
	body, _ := json.Marshal(opensandbox.Command{
		Command:   "exec </dev/null && if command -v timeout >/dev/null 2>&1; then exec timeout -s KILL 600 sh -c " + q + "; else exec sh -c " + q + "; fi",
		TimeoutMS: 605000,
	})
	req, _ := http.NewRequest(http.MethodPost, "http://"+strings.TrimPrefix(ex.URL, "http://")+"/command", bytes.NewReader(body))
	for k, v := range ex.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if res, err := opensandbox.ParseStream(resp.Body); err != nil || res.ExitCode != 0 {
		tb.Fatalf("%+v %v", res, err)
	}
}

// BenchmarkExec is one Exec of `true` at real execd's timing.
func BenchmarkExec(b *testing.B) {
	sb, _ := benchFixture(b)
	for b.Loop() {
		execTrue(b, sb)
	}
}

// BenchmarkExecReadToClose is the same exec as the backend sent it before
// this change, read until execd closed the stream.
func BenchmarkExecReadToClose(b *testing.B) {
	sb, ex := benchFixture(b)
	for b.Loop() {
		oldExecTrue(b, sb, ex)
	}
}

// TestExecCostFigures prints the median and range of 15 execs of `true`
// each way, one after the other (NGHARNESS_BENCH_OSB=1; the figures of
// docs/BENCHMARKS.md).
func TestExecCostFigures(t *testing.T) {
	if os.Getenv("NGHARNESS_BENCH_OSB") != "1" {
		t.Skip("NGHARNESS_BENCH_OSB=1 prints the exec cost figures")
	}
	sb, ex := benchFixture(t)
	var after, before []time.Duration
	for range 15 {
		t0 := time.Now()
		execTrue(t, sb)
		after = append(after, time.Since(t0))
		t0 = time.Now()
		oldExecTrue(t, sb, ex)
		before = append(before, time.Since(t0))
	}
	t.Logf("after (Exec, read to the final event): %s", summary(after))
	t.Logf("before (read until execd closes the stream): %s", summary(before))
}

// summary is "median M (min A, max B) over N".
func summary(d []time.Duration) string {
	s := append([]time.Duration(nil), d...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	r := func(x time.Duration) string { return fmt.Sprintf("%.1f ms", math.Round(float64(x)/1e5)/10) }
	return fmt.Sprintf("median %s (min %s, max %s) over %d", r(med), r(s[0]), r(s[len(s)-1]), len(s))
}
