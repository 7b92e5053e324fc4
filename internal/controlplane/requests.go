package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
)

var (
	requestLine = regexp.MustCompile(`^apiserver_request_total\{(.*)\} (\S+)$`)
	labelPair   = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// APIRequests reads kube-apiserver's own count of the requests it has
// served (apiserver_request_total), summed by "VERB resource", for the
// resources named, or every resource when none is. Suites compare two
// reads to learn what an operation cost; the count is every client's, so
// a read can only gain from what runs beside the test.
func (e *Env) APIRequests(ctx context.Context, resources ...string) (map[string]float64, error) {
	raw, err := e.Clientset.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading kube-apiserver's metrics: %w", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := requestLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range labelPair.FindAllStringSubmatch(m[1], -1) {
			labels[l[1]] = l[2]
		}
		if len(resources) > 0 && !slices.Contains(resources, labels["resource"]) {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, fmt.Errorf("kube-apiserver's metrics: %q: %w", sc.Text(), err)
		}
		out[labels["verb"]+" "+labels["resource"]] += v
	}
	return out, sc.Err()
}
