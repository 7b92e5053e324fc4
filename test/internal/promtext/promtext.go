// Package promtext reads the Prometheus text exposition format that
// kube-apiserver and the manager serve on /metrics, for the benchmarks,
// which read a few series of a scrape and need no client library's
// registry or types for it.
package promtext

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Sample is one series of a scraped metric.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Parse reads the text format: comment and blank lines, then one
// `name{label="value",...} value [timestamp]` per line. It keeps the
// series of the metrics named in names, every series when there are none;
// the lines of other metrics are skipped before their labels are read,
// which matters for kube-apiserver's page of some megabytes.
func Parse(r io.Reader, names ...string) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if end := strings.IndexAny(line, "{ \t"); len(names) > 0 && end > 0 && !slices.Contains(names, line[:end]) {
			continue
		}
		s, err := ParseLine(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %q: %w", n, line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// ParseLine reads one series line.
func ParseLine(line string) (Sample, error) {
	end := strings.IndexAny(line, "{ \t")
	if end <= 0 {
		return Sample{}, errors.New("no metric name followed by a value")
	}
	s := Sample{Name: line[:end], Labels: map[string]string{}}
	rest := line[end:]
	if rest[0] == '{' {
		var err error
		if rest, err = parseLabels(rest[1:], s.Labels); err != nil {
			return Sample{}, err
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 || len(fields) > 2 {
		return Sample{}, fmt.Errorf("want a value and at most a timestamp after the labels, got %q", rest)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return Sample{}, fmt.Errorf("value %q: %w", fields[0], err)
	}
	s.Value = v
	return s, nil
}

// parseLabels reads `name="value",...}` into the map labels and answers
// what follows the closing brace. Values may hold the escapes \\, \" and
// \n, and commas.
func parseLabels(s string, labels map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return "", errors.New("labels not closed with }")
		}
		if s[0] == '}' {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return "", fmt.Errorf(`want name="value" at %q`, s)
		}
		name := strings.TrimSpace(s[:eq])
		var v strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] != '\\' {
				v.WriteByte(s[i])
				continue
			}
			if i++; i == len(s) {
				break
			}
			switch s[i] {
			case 'n':
				v.WriteByte('\n')
			case '\\', '"':
				v.WriteByte(s[i])
			default:
				return "", fmt.Errorf("label %s: unknown escape \\%c", name, s[i])
			}
		}
		if i >= len(s) {
			return "", fmt.Errorf("label %s: value not closed with \"", name)
		}
		labels[name] = v.String()
		s = strings.TrimLeft(s[i+1:], " \t")
		switch {
		case s == "":
			return "", errors.New("labels not closed with }")
		case strings.HasPrefix(s, ","):
			s = s[1:]
		case !strings.HasPrefix(s, "}"):
			return "", fmt.Errorf("label %s: want , or } after its value, got %q", name, s)
		}
	}
}

// Sum is the sum of the series of name whose labels include match, and
// whether there was any.
func Sum(samples []Sample, name string, match map[string]string) (float64, bool) {
	var sum float64
	found := false
series:
	for _, s := range samples {
		if s.Name != name {
			continue
		}
		for k, v := range match {
			if s.Labels[k] != v {
				continue series
			}
		}
		sum += s.Value
		found = true
	}
	return sum, found
}
