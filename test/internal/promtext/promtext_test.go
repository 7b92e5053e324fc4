package promtext

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseLine(t *testing.T) {
	s, err := ParseLine(`m{path="/a,b",msg="say \"hi\"\\n",x="1\n2", } 3.5e+02 1700000000000`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"path": "/a,b", "msg": `say "hi"\n`, "x": "1\n2"}
	if s.Name != "m" || s.Value != 350 {
		t.Errorf("got %s %v", s.Name, s.Value)
	}
	if d := cmp.Diff(want, s.Labels); d != "" {
		t.Errorf("labels (-want +got):\n%s", d)
	}
	if s, err := ParseLine("up 1"); err != nil || s.Name != "up" || s.Value != 1 || len(s.Labels) != 0 {
		t.Errorf("no labels: %+v %v", s, err)
	}
	for _, bad := range []struct{ line, says string }{
		{`m{a="1"`, "not closed with }"},
		{`m{a="1} 2`, "not closed with \""},
		{`m{a=1} 2`, `want name="value"`},
		{`m{a="1" b="2"} 2`, "want , or }"},
		{`m{a="\q"} 2`, `unknown escape \q`},
		{`m{a="1"}`, "want a value"},
		{`m{a="1"} two`, `value "two"`},
		{`m{a="1"} 1 2 3`, "at most a timestamp"},
		{`{a="1"} 1`, "no metric name"},
	} {
		_, err := ParseLine(bad.line)
		if err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%s: error %v, want one saying %q", bad.line, err, bad.says)
		}
	}
}

func TestParseNamesAndLines(t *testing.T) {
	if _, err := Parse(strings.NewReader("# HELP m x\nm 1\nm{ 2\n")); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("a bad line is named by its number: %v", err)
	}
	// With names, other metrics' lines are not read, even bad ones.
	in := "a{x=\"1\"} 1\nb{ broken\na{x=\"2\"} 2\nc 5\n"
	got, err := Parse(strings.NewReader(in), "a", "c")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("kept %d series, want 3: %+v", len(got), got)
	}
	if v, ok := Sum(got, "a", nil); !ok || v != 3 {
		t.Errorf("sum of a: %v %v, want 3", v, ok)
	}
	if v, ok := Sum(got, "a", map[string]string{"x": "2"}); !ok || v != 2 {
		t.Errorf("sum of a{x=2}: %v %v, want 2", v, ok)
	}
	if _, ok := Sum(got, "b", nil); ok {
		t.Error("b was skipped, yet found")
	}
}
