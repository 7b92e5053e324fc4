// Package monitoring tests what the chart gives Prometheus and Grafana: the
// ServiceMonitor, PodMonitor, PrometheusRule and dashboard it renders, the
// alerting rules under promtool (every alert firing and not firing), and a
// real Prometheus scraping a real manager, where every alert expression
// and every dashboard query must find the metrics it names.
//
// It needs Debian's prometheus package (prometheus and promtool on PATH;
// hack/handles/prometheus.sh installs it, as `make handle-deps` does in
// CI). Without it the tests skip, and fail when CI=true.
package monitoring
