package route

import (
	"reflect"
	"testing"
	"unicode/utf8"
)

// The calls the handles, the CLI and other languages' JSON libraries send
// are read by the fast path, and it reads them as Decode's careful path
// does: otherwise it saves nothing.
func TestTheFastPathReadsWhatClientsSend(t *testing.T) {
	for _, body := range []string{
		// Go's encoding/json of the handle's map: keys sorted, no space.
		`{"namespace":"team-a","operations":[{"limit":1,"name":"daily-report","op":"acquire","owner":"cron-7","ttlSeconds":30,"waitSeconds":10}]}`,
		`{"operations":[{"name":"daily-report","op":"release","owner":"cron-7","slot":0,"token":90107}]}`,
		// Python's json.dumps: a space after each separator.
		`{"operations": [{"op": "renew", "name": "daily-report", "slot": 2, "token": 18446744073709551615, "owner": "cron-7", "ttlSeconds": 30}]}`,
		// Pretty-printed, several operations, non-ASCII names.
		"{\n  \"operations\": [\n    {\"op\": \"get\", \"name\": \"bericht-über\"},\n    {\"op\": \"check\", \"name\": \"x\", \"expect\": 7}\n  ]\n}\n",
	} {
		fast, ok := decodeFast([]byte(body))
		if !ok {
			t.Errorf("the fast path did not read %s", body)
			continue
		}
		careful, bad := decodeCareful([]byte(body))
		if bad != nil || !reflect.DeepEqual(fast, careful) {
			t.Errorf("%s: fast %+v, careful %+v %v", body, fast, careful, bad)
		}
	}
}

// Whatever the fast path does not read plainly, or finds wrong, it leaves
// to the careful path, which names the mistake.
func TestTheFastPathLeavesTheRestToTheCarefulOne(t *testing.T) {
	for _, body := range []string{
		`{"operations":[{"op":"acquire","name":"a\u00e9","ttlSeconds":30}]}`,           // an escape: fine, but careful
		`{"operations":[{"op":"acquire","name":"a","ttlSeconds":30.0}]}`,               // a fraction
		`{"operations":[{"op":"acquire","name":"a","ttlSeconds":3e1}]}`,                // an exponent
		`{"operations":[{"op":"acquire","name":"a","ttlSeconds":0}]}`,                  // out of range
		`{"operations":[{"op":"acquire","name":"a","ttlSeconds":030}]}`,                // a leading zero
		`{"operations":[{"op":"acquire","name":"a","name":"b","ttlSeconds":30}]}`,      // a field twice
		`{"operations":[{"op":"acquire","name":"a"}]}`,                                 // a field missing
		`{"operations":[{"op":"get","name":"a","owner":"o"}]}`,                         // a field the op does not take
		`{"operations":[{"op":"get","name":"a"},{"op":"get","name":"a"}]}`,             // a lock twice
		`{"operations":[{"op":"acquire","name":"a#b","ttlSeconds":30}]}`,               // a bad name
		`{"operations":[{"op":"acquire","name":"a","ttlSeconds":30,"owner":"pod:x"}]}`, // the gate's owner
		`{"namespace":"Team","operations":[{"op":"get","name":"a"}]}`,                  // a bad namespace
		`{"operations":[]}`, `{"operations":null}`, `{"namespace":"a"}`, `{}`, `[]`, ``, `{"operations":[{"op":"get","name":"a"}]} x`,
		`{"operations":[{"op":"get","name":"a"}],"operations":[{"op":"get","name":"b"}]}`,
	} {
		if req, ok := decodeFast([]byte(body)); ok {
			t.Errorf("the fast path read %s as %+v", body, req)
		}
	}
}

// FuzzDecodeFast holds the fast path to the careful one: a call it reads
// is one the careful path reads too, the same.
func FuzzDecodeFast(f *testing.F) {
	for _, s := range []string{
		`{"namespace":"team-a","operations":[{"limit":3,"name":"daily-report","op":"acquire","owner":"cron-7","ttlSeconds":30,"waitSeconds":10}]}`,
		`{"operations":[{"op":"renew","name":"x","slot":0,"token":90101,"owner":"o","ttlSeconds":30}]}`,
		`{"operations":[{"op":"release","name":"x","token":1},{"op":"get","name":"y"},{"op":"check","name":"z","expect":2}]}`,
		`{"operations":[{"op":"acquire","name":"a","ttlSeconds":1.5}]}`,
		`{ "operations" : [ { "op" : "get" , "name" : "a" } ] } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !utf8.Valid(body) {
			return // Decode refuses it before either path
		}
		fast, ok := decodeFast(body)
		if !ok {
			return
		}
		careful, bad := decodeCareful(body)
		if bad != nil {
			t.Fatalf("the fast path read %q, which the careful one refuses: %v", body, bad)
		}
		if !reflect.DeepEqual(fast, careful) {
			t.Fatalf("%q: fast %+v, careful %+v", body, fast, careful)
		}
	})
}
