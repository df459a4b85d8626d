// Package metrics is the server's Prometheus metrics, served on the admin
// listener (serve --metrics-addr). Counters and histograms are fed as
// things happen (Observe: every sandbox operation, whatever asked for it);
// gauges are read from their sources at each scrape (the sandboxes, the warm
// pools, the host), so a scrape always shows the present and nothing is
// kept that could drift from it.
//
// Names and units follow Prometheus' conventions (base units, _total for
// counters) and pass `promtool check metrics`.
package metrics

import (
	"context"
	"errors"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Sandboxes is what the metrics read from the sandbox manager at a scrape.
type Sandboxes interface {
	List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Info, error)
	WarmPools() map[string]sandbox.PoolDepth
	Metrics(ctx context.Context, id string, start, end time.Time) ([]sandbox.Metric, error)
}

// Options say where the gauges come from.
type Options struct {
	Sandboxes Sandboxes
	// DataDir's filesystem is the one whose free space is reported.
	DataDir string
	// PerSandbox adds each running sandbox's CPU, memory and disk, labelled
	// with its ID (a series per sandbox: off by default).
	PerSandbox bool
}

// Metrics holds the registry and the metrics fed as things happen.
type Metrics struct {
	reg        *prometheus.Registry
	ops        *prometheus.CounterVec
	opTime     *prometheus.HistogramVec
	proxyReqs  *prometheus.CounterVec
	proxyBytes *prometheus.CounterVec
	// bytesTo and bytesFrom are proxyBytes' two series, taken once: Bytes
	// runs at every read of every proxied stream.
	bytesTo, bytesFrom prometheus.Counter
	builds             *prometheus.CounterVec
	buildTime          prometheus.Histogram
	webhookLag         prometheus.Histogram
}

// opBuckets span a warm claim (a few ms) to a large resume or fork (tens
// of seconds).
var opBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// New makes the metrics and registers the collectors that read o's
// sources.
func New(o Options) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_sandbox_operations_total",
			Help: "Sandbox operations (create, kill, pause, resume, fork, snapshot) that ended, by outcome: ok, client_error (not found, conflict, invalid, limit) or error.",
		}, []string{"operation", "outcome"}),
		opTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "airlock_sandbox_operation_duration_seconds",
			Help:    "How long sandbox operations took, successful or not.",
			Buckets: opBuckets,
		}, []string{"operation"}),
		proxyReqs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_proxy_requests_total",
			Help: "Requests the sandbox proxy routed to a sandbox, by what they reach: envd, the code interpreter or a user port.",
		}, []string{"kind"}),
		proxyBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_proxy_bytes_total",
			Help: "Bytes the sandbox proxy carried, by direction (to_sandbox: request bodies and what clients send on upgraded connections; from_sandbox: responses).",
		}, []string{"direction"}),
		builds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_template_builds_total",
			Help: "Template builds asked for through the E2B API that ended, by outcome (ready or error).",
		}, []string{"outcome"}),
		buildTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "airlock_template_build_duration_seconds",
			Help:    "How long template builds took from their request to their end, waiting included.",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600},
		}),
		webhookLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "airlock_webhook_delivery_lag_seconds",
			Help:    "How long after its event each successful webhook delivery was made (retries included).",
			Buckets: []float64{.01, .05, .1, .5, 1, 5, 30, 60, 300, 1800, 3600},
		}),
	}
	m.reg.MustRegister(m.ops, m.opTime, m.proxyReqs, m.proxyBytes, m.builds, m.buildTime, m.webhookLag,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{o: o})
	// Every operation's series exist from the start, at zero, so that a
	// rate over them is defined before the first one ends.
	for _, op := range []sandbox.Op{sandbox.OpCreate, sandbox.OpKill, sandbox.OpPause, sandbox.OpResume, sandbox.OpFork, sandbox.OpSnapshot} {
		for _, oc := range []string{"ok", "client_error", "error"} {
			m.ops.WithLabelValues(string(op), oc)
		}
		m.opTime.WithLabelValues(string(op))
	}
	for _, k := range []string{"envd", "interpreter", "port"} {
		m.proxyReqs.WithLabelValues(k)
	}
	m.bytesTo, m.bytesFrom = m.proxyBytes.WithLabelValues("to_sandbox"), m.proxyBytes.WithLabelValues("from_sandbox")
	for _, oc := range []string{"ready", "error"} {
		m.builds.WithLabelValues(oc)
	}
	return m
}

// Request counts a request the sandbox proxy routed (proxy.Stats).
func (m *Metrics) Request(kind string) { m.proxyReqs.WithLabelValues(kind).Inc() }

// Bytes counts bytes the sandbox proxy carried (proxy.Stats).
func (m *Metrics) Bytes(toSandbox bool, n int) {
	if toSandbox {
		m.bytesTo.Add(float64(n))
	} else {
		m.bytesFrom.Add(float64(n))
	}
}

// BuildFinished counts a template build that ended
// (tplbuild.Options.Finished).
func (m *Metrics) BuildFinished(status string, took time.Duration) {
	m.builds.WithLabelValues(status).Inc()
	m.buildTime.Observe(took.Seconds())
}

// WebhookDelivered records a successful webhook delivery's lag
// (webhook.Options.Delivered).
func (m *Metrics) WebhookDelivered(lag time.Duration) { m.webhookLag.Observe(lag.Seconds()) }

// Observe counts a sandbox operation that ended (sandbox.Options.Observe).
func (m *Metrics) Observe(op sandbox.Op, took time.Duration, err error) {
	m.ops.WithLabelValues(string(op), outcome(err)).Inc()
	m.opTime.WithLabelValues(string(op)).Observe(took.Seconds())
}

// outcome sorts an operation's error: the caller's mistake or the server's.
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, sandbox.ErrNotFound), errors.Is(err, sandbox.ErrTemplateNotFound),
		errors.Is(err, sandbox.ErrInvalid), errors.Is(err, sandbox.ErrConflict), errors.Is(err, sandbox.ErrLimit),
		errors.Is(err, context.Canceled):
		return "client_error"
	}
	return "error"
}

// Handler serves the metrics in Prometheus' text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: nil})
}

// stateCollector reads the gauges at each scrape.
type stateCollector struct{ o Options }

var (
	sandboxesDesc = prometheus.NewDesc("airlock_sandboxes",
		"Sandboxes the server holds, by state (running or paused) and template ID; warm-pool sandboxes not yet claimed are not counted.",
		[]string{"state", "template"}, nil)
	warmReadyDesc = prometheus.NewDesc("airlock_warm_pool_ready_sandboxes",
		"Started sandboxes a template's warm pool holds ready to hand out.", []string{"template"}, nil)
	warmTargetDesc = prometheus.NewDesc("airlock_warm_pool_target_sandboxes",
		"How many ready sandboxes a template's warm pool is to keep (serve --warm-pool).", []string{"template"}, nil)
	memAvailDesc = prometheus.NewDesc("airlock_host_memory_available_bytes",
		"The host's available memory (MemAvailable): what new sandboxes can still take.", nil, nil)
	memTotalDesc = prometheus.NewDesc("airlock_host_memory_bytes",
		"The host's memory (MemTotal).", nil, nil)
	diskFreeDesc = prometheus.NewDesc("airlock_host_data_dir_free_bytes",
		"Free space on the data dir's filesystem (templates, paused sandboxes, the disk pool's image).", nil, nil)
	diskSizeDesc = prometheus.NewDesc("airlock_host_data_dir_size_bytes",
		"Size of the data dir's filesystem.", nil, nil)
	cpusDesc = prometheus.NewDesc("airlock_host_cpus",
		"CPUs the host has.", nil, nil)
	loadDesc = prometheus.NewDesc("airlock_host_load1",
		"The host's load average over one minute; compare with airlock_host_cpus.", nil, nil)
	sbxCPUDesc = prometheus.NewDesc("airlock_sandbox_cpu_usage_ratio",
		"A running sandbox's CPU use in its last sample, as a fraction of its vCPUs (serve --metrics-per-sandbox).", []string{"sandbox_id", "template"}, nil)
	sbxMemDesc = prometheus.NewDesc("airlock_sandbox_memory_used_bytes",
		"A running sandbox's memory use in its last sample (serve --metrics-per-sandbox).", []string{"sandbox_id", "template"}, nil)
	sbxMemMaxDesc = prometheus.NewDesc("airlock_sandbox_memory_limit_bytes",
		"A running sandbox's memory limit (serve --metrics-per-sandbox).", []string{"sandbox_id", "template"}, nil)
	sbxDiskDesc = prometheus.NewDesc("airlock_sandbox_disk_used_bytes",
		"A running sandbox's disk use in its last sample (serve --metrics-per-sandbox).", []string{"sandbox_id", "template"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, warmReadyDesc, warmTargetDesc, memAvailDesc, memTotalDesc, diskFreeDesc, diskSizeDesc, cpusDesc, loadDesc} {
		ch <- d
	}
	if c.o.PerSandbox {
		for _, d := range []*prometheus.Desc{sbxCPUDesc, sbxMemDesc, sbxMemMaxDesc, sbxDiskDesc} {
			ch <- d
		}
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx := context.Background()
	if s := c.o.Sandboxes; s != nil {
		infos, err := s.List(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}})
		if err == nil {
			counts := map[[2]string]int{}
			for _, in := range infos {
				counts[[2]string{string(in.State), in.TemplateID}]++
			}
			for k, n := range counts {
				ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
			}
			if c.o.PerSandbox {
				c.perSandbox(ctx, ch, infos)
			}
		}
		for tpl, d := range s.WarmPools() {
			ch <- prometheus.MustNewConstMetric(warmReadyDesc, prometheus.GaugeValue, float64(d.Ready), tpl)
			ch <- prometheus.MustNewConstMetric(warmTargetDesc, prometheus.GaugeValue, float64(d.Target), tpl)
		}
	}
	h := ReadHost(c.o.DataDir)
	if h.MemoryAvailableBytes > 0 {
		ch <- prometheus.MustNewConstMetric(memAvailDesc, prometheus.GaugeValue, float64(h.MemoryAvailableBytes))
	}
	if h.MemoryTotalBytes > 0 {
		ch <- prometheus.MustNewConstMetric(memTotalDesc, prometheus.GaugeValue, float64(h.MemoryTotalBytes))
	}
	if h.DiskTotalBytes > 0 {
		ch <- prometheus.MustNewConstMetric(diskFreeDesc, prometheus.GaugeValue, float64(h.DiskFreeBytes))
		ch <- prometheus.MustNewConstMetric(diskSizeDesc, prometheus.GaugeValue, float64(h.DiskTotalBytes))
	}
	ch <- prometheus.MustNewConstMetric(cpusDesc, prometheus.GaugeValue, float64(h.CPUs))
	if h.Load1 >= 0 {
		ch <- prometheus.MustNewConstMetric(loadDesc, prometheus.GaugeValue, h.Load1)
	}
}

// Host is the host's headroom: what new sandboxes can still take. A figure
// that could not be read is zero (Load1: -1).
type Host struct {
	CPUs                 int     `json:"cpus"`
	Load1                float64 `json:"load1"`
	MemoryTotalBytes     int64   `json:"memoryTotalBytes"`
	MemoryAvailableBytes int64   `json:"memoryAvailableBytes"`
	DiskTotalBytes       int64   `json:"diskTotalBytes"`
	DiskFreeBytes        int64   `json:"diskFreeBytes"`
}

// ReadHost reads the host's headroom; the disk's is that of the filesystem
// holding dataDir ("" reads none).
func ReadHost(dataDir string) Host {
	h := Host{CPUs: runtime.NumCPU(), Load1: -1}
	h.MemoryAvailableBytes, _ = sandbox.HostMeminfo("MemAvailable")
	h.MemoryTotalBytes, _ = sandbox.HostMeminfo("MemTotal")
	var st unix.Statfs_t
	if dataDir != "" && unix.Statfs(dataDir, &st) == nil {
		h.DiskFreeBytes = int64(st.Bavail) * st.Bsize
		h.DiskTotalBytes = int64(st.Blocks) * st.Bsize
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				h.Load1 = v
			}
		}
	}
	return h
}

// sampleWindow is how far back a sandbox's last sample may be to be
// reported (the manager samples every few seconds).
const sampleWindow = 30 * time.Second

func (c *stateCollector) perSandbox(ctx context.Context, ch chan<- prometheus.Metric, infos []sandbox.Info) {
	since := time.Now().Add(-sampleWindow)
	for _, in := range infos {
		if in.State != sandbox.StateRunning {
			continue
		}
		samples, err := c.o.Sandboxes.Metrics(ctx, in.ID, since, time.Time{})
		if err != nil || len(samples) == 0 {
			continue
		}
		last := samples[len(samples)-1]
		ch <- prometheus.MustNewConstMetric(sbxCPUDesc, prometheus.GaugeValue, last.CPUUsedPct/100, in.ID, in.TemplateID)
		ch <- prometheus.MustNewConstMetric(sbxMemDesc, prometheus.GaugeValue, float64(last.MemUsed), in.ID, in.TemplateID)
		ch <- prometheus.MustNewConstMetric(sbxMemMaxDesc, prometheus.GaugeValue, float64(last.MemTotal), in.ID, in.TemplateID)
		ch <- prometheus.MustNewConstMetric(sbxDiskDesc, prometheus.GaugeValue, float64(last.DiskUsed), in.ID, in.TemplateID)
	}
}
