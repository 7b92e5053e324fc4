package permit

import (
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	cases := []struct {
		name    string
		wantErr string
	}{
		{"daily-report", ""},
		{"a/b c:ü日", ""},
		{strings.Repeat("a", 256), ""},
		{"", "must not be empty"},
		{strings.Repeat("a", 257), "at most 256 bytes, got 257"},
		{strings.Repeat("é", 129), "at most 256 bytes, got 258"},
		{"a#b", "must not contain '#'"},
		{"a\nb", "control character (U+000A"},
		{"a\x00", "control character (U+0000"},
		{"a\x7f", "control character (U+007F"},
		{"a\u0085", "control character (U+0085"},
		{"\xff\xfe", "valid UTF-8"},
	}
	for _, c := range cases {
		err := ValidateName(c.name)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("ValidateName(%q) = %v, want nil", c.name, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("ValidateName(%q) = %v, want an error containing %q", c.name, err, c.wantErr)
		}
	}
}

func TestValidateNumbers(t *testing.T) {
	for _, c := range []struct {
		what string
		err  error
		ok   bool
	}{
		{"ttl 1", ValidateTTL(1), true},
		{"ttl max", ValidateTTL(MaxTTLSeconds), true},
		{"ttl 0", ValidateTTL(0), false},
		{"ttl -1", ValidateTTL(-1), false},
		{"ttl max+1", ValidateTTL(MaxTTLSeconds + 1), false},
		{"limit 1", ValidateLimit(1), true},
		{"limit 1024", ValidateLimit(1024), true},
		{"limit 0", ValidateLimit(0), false},
		{"limit 1025", ValidateLimit(1025), false},
		{"slot 0 of 1", ValidateSlot(0, 1), true},
		{"slot 1 of 1", ValidateSlot(1, 1), false},
		{"slot -1", ValidateSlot(-1, 4), false},
		{"owner empty", ValidateOwner(""), false},
		{"owner 256", ValidateOwner(strings.Repeat("o", 256)), true},
		{"owner 257", ValidateOwner(strings.Repeat("o", 257)), false},
	} {
		if (c.err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok=%v", c.what, c.err, c.ok)
		}
	}
}

func TestToken(t *testing.T) {
	for rv, want := range map[string]uint64{"1": 1, "90101": 90101, "18446744073709551615": 1<<64 - 1} {
		got, err := Token(rv)
		if err != nil || got != want {
			t.Errorf("Token(%q) = %d, %v; want %d", rv, got, err, want)
		}
		if ResourceVersion(got) != rv {
			t.Errorf("ResourceVersion(%d) = %q, want %q", got, ResourceVersion(got), rv)
		}
	}
	for _, rv := range []string{"", "0", "012", "-1", "1.5", "abc", "18446744073709551616"} {
		if _, err := Token(rv); err == nil {
			t.Errorf("Token(%q) accepted a resourceVersion that is not a comparable integer", rv)
		}
	}
}

func TestParseGuard(t *testing.T) {
	g, err := ParseGuard("daily-report#0=90101")
	if err != nil || g != (Guard{Lock: "daily-report", Slot: 0, Token: 90101}) || g.String() != "daily-report#0=90101" {
		t.Fatalf("ParseGuard = %+v, %v", g, err)
	}
	if g, err := ParseGuard("a/b c#1023=7"); err != nil || g.Lock != "a/b c" || g.Slot != 1023 {
		t.Fatalf("ParseGuard = %+v, %v", g, err)
	}
	for _, bad := range []string{"", "x", "x#", "x#0", "x#0=", "x#0=0", "x#-1=5", "x#1024=5", "#0=5", "x#0=5=6", "x#0=1.5"} {
		if _, err := ParseGuard(bad); err == nil {
			t.Errorf("ParseGuard(%q) accepted", bad)
		}
	}
}
