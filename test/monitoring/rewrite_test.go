package monitoring

import "testing"

func TestEverySeriesKeepsMatchersAndStrings(t *testing.T) {
	for in, want := range map[string]string{
		`max by (namespace) (x) > 0`:                               `max by (namespace) (x) > bool 0`,
		`a{code!="200",le=~"1|2"} / b >= 0.5`:                      `a{code!="200",le=~"1|2"} / b >= bool 0.5`,
		`(sum(x{name="a>b"}) or vector(0)) < 1`:                    `(sum(x{name="a>b"}) or vector(0)) < bool 1`,
		"(a - b > 0)\n  or\n(c != 0)":                              "(a - b > bool 0)\n  or\n(c != bool 0)",
		`a == b`:                                                   `a == bool b`,
		`histogram_quantile(0.99, sum by (le) (rate(x[5m]))) <= 1`: `histogram_quantile(0.99, sum by (le) (rate(x[5m]))) <= bool 1`,
	} {
		if got := everySeries(in); got != want {
			t.Errorf("everySeries(%q) = %q, want %q", in, got, want)
		}
	}
}
