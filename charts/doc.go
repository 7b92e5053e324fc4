// Package charts holds the tests of the Helm chart in charts/queen-locks:
// lint, rendering with default and other values, consistency with the
// generated manifests in config/, an install into a real API server, and
// the manager running under the chart's own RBAC.
package charts
