# The monitoring the chart ships: its ServiceMonitor, PodMonitor,
# PrometheusRule and Grafana dashboard, the alerts under promtool, and a
# real Prometheus scraping a real manager (test/monitoring). They need
# Debian's prometheus package: hack/handles/prometheus.sh installs it (make
# handle-deps runs every script there). Included by the Makefile (-include).

##@ Monitoring

.PHONY: monitoring-test monitoring-rules
monitoring-test: tools ## The chart's monitoring objects, promtool's checks and unit tests of the alerts, and every alert and dashboard query against a real Prometheus.
	go test -count=1 ./test/monitoring

monitoring-rules: tools ## Write charts/queen-locks/rules/alerts.yaml from the chart's PrometheusRule template (after changing it).
	go test -count=1 ./test/monitoring -run '^TestRulesFileIsTheChartsRule$$' -update
