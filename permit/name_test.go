package permit

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestNameReadable(t *testing.T) {
	cases := []struct {
		lock string
		slot int
		want string
	}{
		{"daily-report", 0, "daily-report.0"},
		{"gpu", 3, "gpu.3"},
		{"a", 1023, "a.1023"},
		{strings.Repeat("a", 63), 0, strings.Repeat("a", 63) + ".0"},
	}
	for _, c := range cases {
		if got := Name(c.lock, c.slot); got != c.want {
			t.Errorf("Name(%q, %d) = %q, want %q", c.lock, c.slot, got, c.want)
		}
	}
}

func TestNameHashedFormsStayDistinct(t *testing.T) {
	// Each of these is not a DNS label, so it is hashed; the slugs collide on
	// purpose and the names must not.
	locks := []string{"Daily-Report", "daily_report", "daily report", "daily/report", "DAILY-REPORT",
		"daily-report-", "-daily-report", strings.Repeat("a", 64), "ü", "日報", "a.b", "a..b"}
	seen := map[string]string{}
	for _, l := range locks {
		n := Name(l, 0)
		if strings.Count(n, ".") != 2 {
			t.Errorf("Name(%q) = %q, want the hashed form with two dots", l, n)
		}
		if prev, ok := seen[n]; ok {
			t.Errorf("Name(%q) = Name(%q) = %q", l, prev, n)
		}
		seen[n] = l
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("Name(%q) = %q is not a valid object name: %v", l, n, errs)
		}
	}
	// A readable name that looks like a hashed one still differs: it has one dot.
	h := Name("Foo", 0)
	parts := strings.Split(h, ".")
	forged := parts[0] + "-" + parts[1]
	if Name(forged, 0) == h {
		t.Fatalf("lock %q forged the permit name of %q", forged, "Foo")
	}
}

func TestLabelValueIsValid(t *testing.T) {
	for _, l := range []string{"daily-report", "Daily_Report.v2", "a/b", "日報", strings.Repeat("x", 256), "-x-", "#"} {
		v := LabelValue(l)
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("LabelValue(%q) = %q: %v", l, v, errs)
		}
	}
	if LabelValue("Daily_Report.v2") != "Daily_Report.v2" {
		t.Errorf("a valid label value should be kept as it is")
	}
}

// FuzzName checks that any two valid (lock, slot) pairs give valid object
// names, equal only when the pairs are equal.
func FuzzName(f *testing.F) {
	f.Add("daily-report", 0, "Daily-Report", 0)
	f.Add("a.1", 0, "a", 1)
	f.Add("a/b", 7, "a-b", 7)
	f.Add(strings.Repeat("é", 128), 1023, strings.Repeat("E", 256), 1023)
	f.Add("UPPER", 2, "upper", 2)
	f.Fuzz(func(t *testing.T, a string, sa int, b string, sb int) {
		if ValidateName(a) != nil || ValidateName(b) != nil {
			t.Skip()
		}
		sa, sb = abs(sa)%MaxLimit, abs(sb)%MaxLimit
		na, nb := Name(a, sa), Name(b, sb)
		for _, n := range []string{na, nb} {
			if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
				t.Fatalf("invalid object name %q: %v", n, errs)
			}
		}
		if Name(a, sa) != na {
			t.Fatalf("Name(%q, %d) is not stable", a, sa)
		}
		if (na == nb) != (a == b && sa == sb) {
			t.Fatalf("Name(%q, %d) = %q, Name(%q, %d) = %q", a, sa, na, b, sb, nb)
		}
		if errs := validation.IsValidLabelValue(LabelValue(a)); len(errs) > 0 {
			t.Fatalf("LabelValue(%q) = %q: %v", a, LabelValue(a), errs)
		}
	})
}

func abs(n int) int {
	if n < 0 {
		if n == -n { // math.MinInt
			return 0
		}
		return -n
	}
	return n
}
