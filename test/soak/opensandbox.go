package main

// -backend opensandbox: one real `ngdriver serve` and one real `ngdriver
// owner serve --backend opensandbox`, both over the fake OpenSandbox of
// internal/fake/execd (lifecycle server and execd, in the soak's process) at
// its defaults, the real server's timing as measured (issues 11 and 19:
// execd's output polled every 100 ms and streams held 1 s after their
// end, a create answered before execd listens, a snapshot that freezes
// its sandbox 1.25 s when alone; -osb-capacity snapshots at full speed at
// once, 1 as measured). Every command runs for real on this machine (the
// fake harness under ngsup, in a mount namespace per command). Rollouts
// are posted in waves (-ramp), each launched before the next; then
// checkpoints as Gym drives them, timed: prepare (the driver pauses every
// launch through execd), the driver's commit, the owner's commit (a
// snapshot of every session's sandbox through the lifecycle server). No
// crash.

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// osbCapacity is the fake server's SnapshotCapacity (-osb-capacity).
var osbCapacity int

// rampFor bounds the ramp (-ramp-for): no wave is posted after it, and
// the checkpoints are taken over the runs launched by then.
var rampFor time.Duration

func init() {
	flag.DurationVar(&rampFor, "ramp-for", 0, "-backend opensandbox: post no more waves after this long (0: post every rollout); the checkpoints then cover the runs launched")
	flag.IntVar(&osbCapacity, "osb-capacity", 1, "-backend opensandbox: snapshots the fake server takes at full speed at once (1: the real server as measured)")
}

// launchedIn counts the launches a driver's JSON log reports.
func launchedIn(logPath string) int {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return 0
	}
	return bytes.Count(data, []byte(`"msg":"launched"`))
}

func runOpenSandbox(c config) error {
	if os.Geteuid() != 0 {
		return errors.New("run as root (the fake OpenSandbox runs each command in a mount namespace of its own)")
	}
	nofile := raiseFileLimit()
	bin, _ := filepath.Abs(c.bin)
	if err := c.defaults("ngsoak-osb-"); err != nil {
		return err
	}
	base := filepath.Join(c.work, "osb")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	const apiKey = "soak-osb-key"
	srv, err := fakeexecd.Start(fakeexecd.Options{Base: base, APIKey: apiKey, SnapshotCapacity: osbCapacity})
	if err != nil {
		return err
	}
	// Everything started below ends on the way out, and also at SIGINT
	// or SIGTERM: the launches run in the fake server's sandboxes, which
	// only its Close ends.
	var cleanups []func()
	var once sync.Once
	cleanup := func() {
		once.Do(func() {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		})
	}
	defer cleanup()
	cleanups = append(cleanups, func() {
		srv.Close()
		if !c.keep {
			os.RemoveAll(base)
		}
	})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if _, ok := <-sigs; ok {
			fmt.Fprintln(os.Stderr, "soak: interrupted; ending what it started")
			cleanup()
			os.Exit(1)
		}
	}()
	token := "soak-" + strconv.Itoa(os.Getpid())
	env := []string{"NG_CONTROL_TOKEN=" + token, "SOAK_OSB_KEY=" + apiKey}
	mp := local.DefaultMountPoint
	cfg := map[string]any{
		"listen": "127.0.0.1:0", "name": "soak", "token_env": "NG_CONTROL_TOKEN", "max_runs": c.maxRuns,
		"adapter": "fake", "stop_grace": "2s", "ngsup_dir": bin, "log_format": "json",
		"owner": map[string]any{"retries": 5},
		"backends": map[string]any{"opensandbox": map[string]any{"server": srv.URL(), "api_key_env": "SOAK_OSB_KEY", "image": "soak",
			"root": mp + "/" + local.RootFolder, "workdir": mp + "/" + local.WorkFolder, "ttl": "2h"}},
	}
	data, _ := json.Marshal(cfg) // JSON is YAML
	cfgPath := filepath.Join(c.work, "ngdriver.yaml")
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		return err
	}
	ngdriver := filepath.Join(bin, "ngdriver")
	own, err := start(ngdriver, filepath.Join(c.work, "owner.log"), env,
		"owner", "serve", "--listen", "127.0.0.1:0", "--backend", "opensandbox", "--config", cfgPath, "--ngsup-dir", bin, "--log-format", "json")
	if err != nil {
		return err
	}
	cleanups = append(cleanups, own.kill)
	driverLog := filepath.Join(c.work, "driver.log")
	d, err := start(ngdriver, driverLog, env, "serve", "--config", cfgPath, "--owner", own.url)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, d.kill)
	pid := d.cmd.Process.Pid
	ctl := &controller{token: token, client: &http.Client{Timeout: 0}}
	// The runs outlast the ramp and the checkpoints; the soak does not wait
	// for them to finish (their sandboxes go with the fake server).
	steps := int((c.duration + 30*time.Minute).Seconds() / c.stepS)
	fmt.Fprintf(os.Stderr, "soak: opensandbox backend (fake, snapshot capacity %d): %d rollouts of %.1fs steps, a checkpoint every %s for %s; open files %d; load %s; work in %s\n",
		osbCapacity, c.rollouts, c.stepS, c.every, c.duration, nofile, loadAvg(), c.work)

	// gone counts the runs whose request came back: none should before
	// the soak ends, so each is a run that failed.
	var gone atomic.Int64
	results := make([]result, c.rollouts)
	var wg sync.WaitGroup
	body := func(i int) map[string]any {
		id := fmt.Sprintf("soak-%05d", i)
		// The harness alone and its sleeps: no child, daemon or session of
		// its own, so that 2,048 launches fit on a small machine.
		return map[string]any{"_ng_rollout_id": id, "task": "soak " + id, "check": "true",
			"fake": map[string]any{"steps": steps, "step_s": c.stepS, "child": false, "own_session": false, "daemon": false, "untagged": false}}
	}
	begin := time.Now()
	posted := 0
	for from := 0; from < c.rollouts; from += rampWave {
		if rampFor > 0 && time.Since(begin) > rampFor {
			fmt.Fprintf(os.Stderr, "soak: the ramp ran out of its %s: %d of %d rollouts posted\n", rampFor, posted, c.rollouts)
			break
		}
		to := min(from+rampWave, c.rollouts)
		postRuns(ctl, d.url, from, to, body, results, &wg, &gone)
		posted = to
		// A run that failed (its seed ran out of time under load, say)
		// counts as done: it will not launch.
		for launchedIn(driverLog)+int(gone.Load()) < to {
			if time.Since(begin) > 60*time.Minute {
				return fmt.Errorf("after %s, %d of %d launched: see %s", time.Since(begin).Round(time.Second), launchedIn(driverLog), to, driverLog)
			}
			time.Sleep(time.Second)
		}
		fmt.Fprintf(os.Stderr, "soak: %d launched, %d failed at %.0fs, load %s\n", launchedIn(driverLog), gone.Load(), time.Since(begin).Seconds(), loadAvg())
	}
	ramp := time.Since(begin)
	_, cpuRamp := usage(pid)

	var cks []checkpointFigures
	ckBegin := time.Now()
	for n := 1; time.Since(ckBegin) < c.duration; n++ {
		id := fmt.Sprintf("ckpt-%03d", n)
		_, a := usage(pid)
		t := time.Now()
		f, err := checkpoint(ctl, d.url, own.url, id, filepath.Join(c.work, "checkpoints", id))
		if err != nil {
			return err
		}
		f.window = time.Since(t).Seconds()
		_, b := usage(pid)
		f.cpu = b - a
		cks = append(cks, f)
		fmt.Fprintf(os.Stderr, "soak: %s: prepare %.3fs, commit %.3fs, owner commit %.3fs, driver CPU %.2fs over %.2fs, load %s\n",
			id, f.prepare, f.commit, f.ownerCommit, f.cpu, f.window, loadAvg())
		os.RemoveAll(filepath.Join(c.work, "checkpoints", fmt.Sprintf("ckpt-%03d", n-3)))
		time.Sleep(time.Until(t.Add(c.every)))
	}
	peak, cpu := usage(pid)
	failedRuns := 0
	for _, r := range results[:posted] {
		if len(r.failed) > 0 || (!r.ok && r.err != "") {
			failedRuns++
		}
	}
	col := func(get func(checkpointFigures) float64) []float64 {
		out := make([]float64, len(cks))
		for i, f := range cks {
			out[i] = get(f)
		}
		return out
	}
	prep := col(func(f checkpointFigures) float64 { return f.prepare })
	launched := launchedIn(driverLog)
	n := float64(launched)
	fmt.Printf("\n## Soak, opensandbox backend (fake server, snapshot capacity %d): %d rollouts launched (of %d), %d checkpoints every %s (load average %s at the end)\n\n", osbCapacity, launched, c.rollouts, len(cks), c.every, loadAvg())
	fmt.Printf("| figure | value |\n|---|---|\n")
	fmt.Printf("| all launched after | %.1f s (driver CPU %.1f s: %.2f ms a rollout) |\n", ramp.Seconds(), cpuRamp, 1000*cpuRamp/n)
	fmt.Printf("| prepare, median (max) | %.3f s (%.3f s) |\n", median(prep), slices.Max(append(prep, 0)))
	fmt.Printf("| prepare, each | %s |\n", fmtList(prep))
	fmt.Printf("| driver commit, median | %.3f s |\n", median(col(func(f checkpointFigures) float64 { return f.commit })))
	fmt.Printf("| owner commit (%d snapshots), median | %.1f s |\n", launched, median(col(func(f checkpointFigures) float64 { return f.ownerCommit })))
	fmt.Printf("| owner commit, each | %s |\n", fmtList(col(func(f checkpointFigures) float64 { return f.ownerCommit })))
	fmt.Printf("| driver CPU a checkpoint, median | %.2f s: %.3f ms a rollout |\n", median(col(func(f checkpointFigures) float64 { return f.cpu })), 1000*median(col(func(f checkpointFigures) float64 { return f.cpu }))/n)
	fmt.Printf("| driver peak memory (VmHWM) | %.0f MB: %.1f KB a rollout |\n", peak, peak*1024/n)
	fmt.Printf("| driver CPU, whole run | %.1f s over %.0f s |\n", cpu, time.Since(begin).Seconds())
	fmt.Printf("| runs that failed or ended early | %d |\n", failedRuns)
	for i, r := range results[:posted] {
		if r.err != "" {
			fmt.Printf("\nfailed: soak-%05d: %.300s\n", i, r.err)
			break
		}
	}
	return nil
}
