package serve

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ngharness/ngharness/pkg/driver"
)

// Metrics are the driver's Prometheus metrics. It implements
// driver.Observer.
type Metrics struct {
	Registry        *prometheus.Registry
	launches        *prometheus.CounterVec
	pauses          prometheus.Counter
	failedPauses    *prometheus.CounterVec
	pauseSeconds    prometheus.Histogram
	continueSeconds prometheus.Histogram
	failedContinues *prometheus.CounterVec
	relaunches      *prometheus.CounterVec
	phaseSeconds    *prometheus.HistogramVec
	httpRequests    *prometheus.CounterVec
}

// latencyBuckets span a fast pause (ms) to the 120 s command budget.
var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// NewRegistry returns a registry holding the standard collectors every
// /metrics of ngdriver serves (serve and owner serve alike): the Go
// runtime's (go_goroutines, go_memstats_*, ...) and the process's
// (process_resident_memory_bytes, process_open_fds, ...).
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// NewMetrics registers the metrics in a NewRegistry; runs by stage are
// read from p at each scrape.
func NewMetrics(p *driver.Participant) *Metrics {
	m := &Metrics{Registry: NewRegistry()}
	m.launches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ngdriver_launches_total", Help: "Harness launches that ended, by outcome (finished, interrupted, failed).",
	}, []string{"outcome"})
	m.pauses = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ngdriver_pauses_total", Help: "Pauses confirmed at checkpoints.",
	})
	m.failedPauses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ngdriver_failed_pauses_total", Help: "Pauses that failed and fell back to stop, by cause.",
	}, []string{"cause"})
	m.pauseSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ngdriver_pause_seconds", Help: "Latency of a pause as the driver sees it (exec included).", Buckets: latencyBuckets,
	})
	m.continueSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ngdriver_continue_seconds", Help: "Latency of a continue as the driver sees it (exec included).", Buckets: latencyBuckets,
	})
	m.failedContinues = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ngdriver_failed_continues_total", Help: "Continues that fell back to stop and relaunch, by cause (failed, found_nothing).",
	}, []string{"cause"})
	m.relaunches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ngdriver_relaunches_total", Help: "Launches after a stop or a crash, by whether they resumed the saved session.",
	}, []string{"resumed"})
	m.phaseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ngdriver_checkpoint_phase_seconds", Help: "Duration of each checkpoint call.", Buckets: latencyBuckets,
	}, []string{"phase"})
	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ngdriver_http_requests_total", Help: "HTTP requests by route and status code.",
	}, []string{"route", "code"})
	runs := prometheus.NewDesc("ngdriver_runs", "Runs registered, by the step they are at and what they are doing.", []string{"stage", "state"}, nil)
	m.Registry.MustRegister(m.launches, m.pauses, m.failedPauses, m.pauseSeconds, m.continueSeconds,
		m.failedContinues, m.relaunches, m.phaseSeconds, m.httpRequests, runsCollector{desc: runs, p: p})
	return m
}

type runsCollector struct {
	desc *prometheus.Desc
	p    *driver.Participant
}

func (c runsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c runsCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[[2]string]int{}
	for _, r := range c.p.Runs() {
		counts[[2]string{string(r.Next), r.State}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

// LaunchEnded implements driver.Observer.
func (m *Metrics) LaunchEnded(o driver.Outcome) { m.launches.WithLabelValues(string(o)).Inc() }

// Paused implements driver.Observer.
func (m *Metrics) Paused(took time.Duration, ok bool, cause string) {
	m.pauseSeconds.Observe(took.Seconds())
	switch {
	case ok:
		m.pauses.Inc()
	case cause != "ended":
		m.failedPauses.WithLabelValues(cause).Inc()
	}
}

// Continued implements driver.Observer.
func (m *Metrics) Continued(took time.Duration, ok bool, cause string) {
	m.continueSeconds.Observe(took.Seconds())
	if !ok {
		m.failedContinues.WithLabelValues(cause).Inc()
	}
}

// Relaunched implements driver.Observer.
func (m *Metrics) Relaunched(resumed bool) {
	if resumed {
		m.relaunches.WithLabelValues("true").Inc()
	} else {
		m.relaunches.WithLabelValues("false").Inc()
	}
}

// phase records how long a checkpoint call took.
func (m *Metrics) phase(name string, took time.Duration) {
	m.phaseSeconds.WithLabelValues(name).Observe(took.Seconds())
}
