package main

// The driver of the memory backend: `ngdriver serve` as cmd/ngdriver
// builds it (the same Runner, participant, metrics and handler, the fake
// adapter with pauses at checkpoints), with the memory backend
// (internal/memsandbox) as its only backend, so that the process the soak
// measures does nothing but the driver's own work. It runs as a child of
// the soak (-role memdriver), in a process of its own, so its CPU and
// memory are its own. Beside ngdriver's routes it serves /debug/ on the
// same loopback listener: pprof, its memory (after a GC) and CPU time
// (getrusage), the memory backend's counts, and POST /debug/finish, which
// makes every launch finish now (memsandbox.Service.FinishAll).

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/internal/memsandbox"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner/httpowner"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/serve"
)

// debugStats is what /debug/stats answers.
type debugStats struct {
	// CPUS is the process's user and system CPU time (getrusage).
	CPUS float64 `json:"cpu_s"`
	// HeapInuse and HeapAlloc are runtime.MemStats' (after a GC when
	// asked with ?gc=1); Sys is what the runtime holds from the system.
	HeapInuse  uint64           `json:"heap_inuse"`
	HeapAlloc  uint64           `json:"heap_alloc"`
	StackInuse uint64           `json:"stack_inuse"`
	Sys        uint64           `json:"sys"`
	Goroutines int              `json:"goroutines"`
	Memory     memsandbox.Stats `json:"memory"`
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// serveMemDriver runs the driver of the memory backend until killed.
func serveMemDriver(args []string) error {
	fs := flag.NewFlagSet("memdriver", flag.ContinueOnError)
	ownerURL := fs.String("owner", "", "the owner's URL")
	maxRuns := fs.Int("max-runs", 0, "the driver's max_runs")
	ngsupDir := fs.String("ngsup-dir", "bin", "folder of the ngsup binaries (uploaded by reference, never run)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("participant", "soak")
	binaries := launch.DefaultBinaries(*ngsupDir)
	if len(binaries) == 0 {
		return fmt.Errorf("no ngsup binary found in %q (make build)", *ngsupDir)
	}
	adapter := &fake.Adapter{Pause: true}
	participant, err := driver.NewParticipant(driver.ParticipantConfig{MaxRuns: *maxRuns, Adapter: adapter.Name(), Instance: "soak",
		Logf: func(format string, args ...any) { log.Info(fmt.Sprintf(format, args...)) }})
	if err != nil {
		return err
	}
	mem := memsandbox.New(memsandbox.Options{Adopt: true})
	rn := &driver.Runner{
		Adapter:     adapter,
		Owner:       &httpowner.Client{BaseURL: *ownerURL, Timeout: time.Minute, VerifyTimeout: 30 * time.Minute, Retries: 5},
		Backends:    map[string]sandbox.Backend{memsandbox.Name: mem},
		Launchers:   &launch.Ngsup{Binaries: binaries, Log: log},
		Participant: participant,
		Log:         log,
		StopGrace:   2 * time.Second,
	}
	metrics := serve.NewMetrics(participant)
	rn.Observer = metrics
	srv := &serve.Server{Runner: rn, Token: os.Getenv("NG_CONTROL_TOKEN"), Metrics: metrics, Log: log}
	handler, err := srv.Handler()
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", handler)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/stats", func(w http.ResponseWriter, r *http.Request) {
		st := debugStats{CPUS: cpuSeconds()}
		if r.URL.Query().Get("gc") == "1" {
			runtime.GC()
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		st.HeapInuse, st.HeapAlloc, st.StackInuse, st.Sys = ms.HeapInuse, ms.HeapAlloc, ms.StackInuse, ms.Sys
		st.Goroutines = runtime.NumGoroutine()
		st.Memory = mem.Stats()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("POST /debug/finish", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%d\n", mem.FinishAll())
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "listening on http://%s\n", ln.Addr())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	return hs.Serve(ln)
}
