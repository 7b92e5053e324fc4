package route_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/queen-locks/queen-locks/internal/route"
)

// Every malformed call is refused whole with 400, names what is wrong, and
// applies nothing: each case carries a valid acquire that must not happen.
func TestBadInputIsRefusedWholeAndAppliesNothing(t *testing.T) {
	ns := namespace(t)
	valid := acquire("must-not-apply", "x", 30, 0)
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf(`{"op":"get","name":"l%d"}`, i)
	}
	overSlots := []string{valid}
	for i := range 4 {
		overSlots = append(overSlots, acquire(fmt.Sprint("s", i), "x", 30, 1024))
	}
	cases := []struct {
		name, ops, wantField, wantMsg string
	}{
		{"name with #", acquire("a#b", "x", 30, 0), "name", "'#'"},
		{"name with a control character", `{"op":"acquire","name":"a\u0007b","ttlSeconds":30}`, "name", "control character"},
		{"name with a newline", `{"op":"acquire","name":"a\nb","ttlSeconds":30}`, "name", "control character"},
		{"empty name", acquire("", "x", 30, 0), "name", "empty"},
		{"257-byte name", acquire(strings.Repeat("n", 257), "x", 30, 0), "name", "256 bytes"},
		{"name not a string", `{"op":"get","name":7}`, "name", "string"},
		{"257-byte owner", acquire("o", strings.Repeat("o", 257), 30, 0), "owner", "256 bytes"},
		{"empty owner", `{"op":"acquire","name":"o","ttlSeconds":30,"owner":""}`, "owner", "empty"},
		{"owner with a terminal escape", `{"op":"acquire","name":"o","ttlSeconds":30,"owner":"a\u001b[2Jb"}`, "owner", "control character (U+001B"},
		{"owner with a NUL", `{"op":"acquire","name":"o","ttlSeconds":30,"owner":"a\u0000b"}`, "owner", "control character (U+0000"},
		{"a gated pod's owner", acquire("o", "pod:0000-victim", 30, 0), "owner", `owners beginning "pod:" are reserved`},
		{"a gated pod's owner on renew", `{"op":"renew","name":"o","token":7,"owner":"pod:0000-victim"}`, "owner", "reserved"},
		{"a gated pod's owner on release", `{"op":"release","name":"o","token":7,"owner":"pod:0000-victim"}`, "owner", "reserved"},
		{"ttlSeconds 0", acquire("t", "x", 0, 0), "ttlSeconds", "whole number from 1"},
		{"ttlSeconds negative", acquire("t", "x", -5, 0), "ttlSeconds", "whole number from 1"},
		{"ttlSeconds 1.5", `{"op":"acquire","name":"t","ttlSeconds":1.5}`, "ttlSeconds", "got 1.5"},
		{"ttlSeconds 3e1", `{"op":"acquire","name":"t","ttlSeconds":3e1}`, "ttlSeconds", "whole number"},
		{"ttlSeconds string", `{"op":"acquire","name":"t","ttlSeconds":"30"}`, "ttlSeconds", "got a string"},
		{"ttlSeconds null", `{"op":"acquire","name":"t","ttlSeconds":null}`, "ttlSeconds", "got null"},
		{"ttlSeconds missing", `{"op":"acquire","name":"t"}`, "ttlSeconds", "required"},
		{"ttlSeconds over a year", acquire("t", "x", 31536001, 0), "ttlSeconds", "31536000"},
		{"ttlSeconds huge", `{"op":"acquire","name":"t","ttlSeconds":99999999999999999999999}`, "ttlSeconds", "whole number"},
		{"limit 0", `{"op":"acquire","name":"l","ttlSeconds":30,"limit":0}`, "limit", "from 1 to 1024"},
		{"limit 1025", acquire("l", "x", 30, 1025), "limit", "from 1 to 1024"},
		{"slot 1024", `{"op":"check","name":"s","slot":1024,"expect":1}`, "slot", "0 to 1023"},
		{"token 0", `{"op":"renew","name":"r","token":0}`, "token", "positive"},
		{"token negative", `{"op":"release","name":"r","token":-1}`, "token", "positive"},
		{"token missing", `{"op":"release","name":"r"}`, "token", "required"},
		{"expect missing", `{"op":"check","name":"c"}`, "expect", "required"},
		{"unknown op", `{"op":"steal","name":"x"}`, "op", "unknown op"},
		{"op missing", `{"name":"x"}`, "op", "required"},
		{"unknown field", `{"op":"get","name":"x","ttlSeconds":30}`, "ttlSeconds", "unknown field"},
		{"slot on acquire", `{"op":"acquire","name":"x","ttlSeconds":30,"slot":1}`, "slot", "unknown field"},
		{"operation not an object", `"get"`, "", "JSON object"},
		{"name with a lone surrogate", `{"op":"acquire","name":"a\ud800b","ttlSeconds":30}`, "name", "lone UTF-16 surrogate"},
		{"owner with a lone low surrogate", `{"op":"acquire","name":"o","ttlSeconds":30,"owner":"a\uDFFFb"}`, "owner", "lone UTF-16 surrogate"},
		{"a lone surrogate after an escaped backslash", `{"op":"acquire","name":"a\\ufffd\ud800","ttlSeconds":30}`, "name", "lone UTF-16 surrogate"},
		{"a high surrogate before a non-surrogate", `{"op":"acquire","name":"a\ud800\u0041","ttlSeconds":30}`, "name", "lone UTF-16 surrogate"},
		{"a field given twice", `{"op":"get","name":"l","name":"m"}`, "name", "is given twice"},
		{"duplicate names", acquire("dup", "x", 30, 0) + "," + `{"op":"get","name":"dup"}`, "name", "duplicate lock name"},
		{"65 operations", strings.Join(many, ","), "operations", "1 to 64"},
		{"over 4096 slots", strings.Join(overSlots, ","), "limit", "4096 slots"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := `{"namespace":"` + ns + `","operations":[` + valid + "," + c.ops + `]}`
			if c.name == "65 operations" || c.name == "over 4096 slots" {
				body = `{"namespace":"` + ns + `","operations":[` + c.ops + `]}`
			}
			code, out := call(t, devURL, "", body)
			e, _ := out["error"].(J)
			if code != http.StatusBadRequest || e == nil || num(t, e["code"]) != 400 {
				t.Fatalf("answered %d: %v", code, out)
			}
			msg, _ := e["message"].(string)
			if !strings.Contains(msg, c.wantMsg) || (c.wantField != "" && e["field"] != c.wantField) {
				t.Fatalf("error %v; want field %q and a message containing %q", e, c.wantField, c.wantMsg)
			}
			if c.name != "65 operations" && c.name != "over 4096 slots" && c.name != "duplicate names" && num(t, e["index"]) != 1 {
				t.Fatalf("error names index %v, want 1", e["index"])
			}
		})
	}
	for name, body := range map[string]string{
		"invalid JSON":           `{"operations":[`,
		"not an object":          `[1,2]`,
		"null":                   `null`,
		"empty body":             ``,
		"trailing data":          `{"operations":[{"op":"get","name":"x"}]} {}`,
		"no operations":          `{"operations":[]}`,
		"operations missing":     `{"namespace":"default"}`,
		"operations not array":   `{"operations":{"op":"get"}}`,
		"unknown top-level":      `{"operations":[{"op":"get","name":"x"}],"ns":"x"}`,
		"bad namespace":          `{"namespace":"Not_A_Namespace","operations":[` + valid + `]}`,
		"namespace not a string": `{"namespace":5,"operations":[` + valid + `]}`,
		"operations given twice": `{"operations":[{"op":"get","name":"x"}],"operations":[` + valid + `]}`,
	} {
		if code, out := call(t, devURL, "", body); code != http.StatusBadRequest || out["error"] == nil {
			t.Errorf("%s: answered %d: %v", name, code, out)
		}
	}
	if ps := permits(t, ns); len(ps) != 0 {
		t.Fatalf("refused calls applied %d permits", len(ps))
	}
}

// A namespace that does not exist is the caller's mistake: answered 400,
// and logged as a refusal, not as an error of the route.
func TestMissingNamespaceIsABadRequest(t *testing.T) {
	var mu sync.Mutex
	var logged []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, prefix+" "+args)
	}, funcr.Options{})
	url, stop, err := env.StartRouteConfig(route.Config{Auth: route.AuthNone, DefaultNamespace: "default", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	code, out := call(t, url, "", `{"namespace":"no-such-namespace","operations":[`+acquire("x", "x", 30, 0)+`]}`)
	if code != http.StatusBadRequest || out["error"].(J)["field"] != "namespace" {
		t.Fatalf("answered %d: %v", code, out)
	}
	mu.Lock()
	defer mu.Unlock()
	said := strings.Join(logged, "\n")
	if !strings.Contains(said, "no such namespace") || strings.Contains(said, `"error"`) {
		t.Fatalf("the route logged: %s", said)
	}
}

func TestInvalidUTF8IsRefusedNotReplaced(t *testing.T) {
	ns := namespace(t)
	body := `{"namespace":"` + ns + `","operations":[{"op":"acquire","name":"a` + "\xff" + `b","ttlSeconds":30}]}`
	if code, out := call(t, devURL, "", body); code != http.StatusBadRequest || !strings.Contains(errorOf(t, out)["message"].(string), "UTF-8") {
		t.Fatalf("invalid UTF-8 answered %d: %v", code, out)
	}
	if n := len(permits(t, ns)); n != 0 {
		t.Fatalf("%d permits stored", n)
	}
	// U+FFFD sent as itself or escaped, and a surrogate pair, are names
	// like any other: only a lone surrogate is refused.
	for raw, want := range map[string]string{
		`a\ufffdb`:      "a\uFFFDb",
		`a\uFFFDb`:      "a\uFFFDb",
		"a\uFFFDb":      "a\uFFFDb",
		`x\ud83d\ude00`: "x\U0001F600",
		`a\\ud800`:      `a\ud800`,
	} {
		req, bad := route.Decode([]byte(`{"operations":[{"op":"get","name":"` + raw + `"}]}`))
		if bad != nil || req.Operations[0].Name != want {
			t.Errorf("name %s: %+v %v, want %q", raw, req, bad, want)
		}
	}
}
