package route

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/queen-locks/queen-locks/permit"
)

// The operations of the route.
const (
	OpAcquire = "acquire"
	OpRenew   = "renew"
	OpRelease = "release"
	OpGet     = "get"
	OpCheck   = "check"
)

// fields lists, per operation, the fields it takes and which are required.
var fields = map[string]map[string]bool{
	OpAcquire: {"op": true, "name": true, "ttlSeconds": true, "owner": false, "limit": false, "waitSeconds": false},
	OpRenew:   {"op": true, "name": true, "slot": false, "token": true, "owner": false, "ttlSeconds": false},
	OpRelease: {"op": true, "name": true, "slot": false, "token": true, "owner": false},
	OpGet:     {"op": true, "name": true},
	OpCheck:   {"op": true, "name": true, "slot": false, "expect": true},
}

var opNames = []string{OpAcquire, OpRenew, OpRelease, OpGet, OpCheck}

// Operation is one decoded, validated operation of a call.
type Operation struct {
	Op         string
	Name       string
	Owner      string // "" when the caller sent none
	TTLSeconds int64  // 0 when a renew sent none: keep the permit's
	Limit      int    // acquire; 1 when not sent
	// WaitSeconds is how long an acquire may wait for a slot to free; 0
	// answers at once.
	WaitSeconds int
	Slot        int    // renew, release, check; 0 when not sent
	Token       uint64 // renew, release
	Expect      uint64 // check
}

// Request is a decoded, validated call.
type Request struct {
	Namespace  string // "" when the body named none
	Operations []Operation
}

// BadRequest is a call refused whole: it names the operation (Index, or -1
// for the call itself) and the field that is wrong.
type BadRequest struct {
	Index   int
	Field   string
	Message string
}

func (e *BadRequest) Error() string {
	if e.Index >= 0 {
		if e.Field != "" {
			return fmt.Sprintf("operations[%d].%s: %s", e.Index, e.Field, e.Message)
		}
		return fmt.Sprintf("operations[%d]: %s", e.Index, e.Message)
	}
	if e.Field != "" {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

func bad(index int, field, format string, args ...any) *BadRequest {
	return &BadRequest{Index: index, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Decode reads and validates a call. Any mistake refuses the whole call,
// before anything is applied.
func Decode(body []byte) (*Request, *BadRequest) {
	// encoding/json would turn invalid UTF-8 into U+FFFD, and a name into
	// another name than the one sent; the contract says names are valid
	// UTF-8, so refuse it instead.
	if !utf8.Valid(body) {
		return nil, bad(-1, "", "the body is not valid UTF-8")
	}
	if req, ok := decodeFast(body); ok {
		return req, nil
	}
	return decodeCareful(body)
}

// decodeCareful reads a call the way that names what is wrong with it.
func decodeCareful(body []byte) (*Request, *BadRequest) {
	var whole json.RawMessage
	if err := strictUnmarshal(body, &whole); err != nil {
		return nil, bad(-1, "", "invalid JSON: %v", err)
	}
	top, err := object(whole)
	var dup duplicateField
	switch {
	case errors.As(err, &dup):
		return nil, bad(-1, string(dup), "%v", dup)
	case err != nil:
		return nil, bad(-1, "", "the body must be a JSON object with an operations array: %v", err)
	}
	for _, k := range sortedKeys(top) {
		if k != "namespace" && k != "operations" {
			return nil, bad(-1, k, "unknown field; the call takes namespace and operations")
		}
	}
	req := &Request{}
	if raw, ok := top["namespace"]; ok {
		ns, err := str(raw)
		if err != nil {
			return nil, bad(-1, "namespace", "%v", err)
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, bad(-1, "namespace", "%q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		req.Namespace = ns
	}
	raw, ok := top["operations"]
	if !ok {
		return nil, bad(-1, "operations", "is required")
	}
	var ops []json.RawMessage
	if err := json.Unmarshal(raw, &ops); err != nil || ops == nil {
		return nil, bad(-1, "operations", "must be an array of operations")
	}
	if len(ops) == 0 || len(ops) > permit.MaxOperations {
		return nil, bad(-1, "operations", "must hold 1 to %d operations, got %d", permit.MaxOperations, len(ops))
	}
	seen := map[string]int{}
	slots := 0
	for i, raw := range ops {
		op, e := decodeOp(i, raw)
		if e != nil {
			return nil, e
		}
		if j, dup := seen[op.Name]; dup {
			return nil, bad(i, "name", "duplicate lock name %q (also operations[%d]); each operation of a call names a different lock", op.Name, j)
		}
		seen[op.Name] = i
		slots += max(op.Limit, 1)
		if slots > permit.MaxSlotsPerCall {
			return nil, bad(i, "limit", "the call asks for more than %d slots in all (the sum of limits)", permit.MaxSlotsPerCall)
		}
		req.Operations = append(req.Operations, op)
	}
	return req, nil
}

func decodeOp(i int, raw json.RawMessage) (Operation, *BadRequest) {
	m, err := object(raw)
	var dup duplicateField
	switch {
	case errors.As(err, &dup):
		return Operation{}, bad(i, string(dup), "%v", dup)
	case err != nil:
		return Operation{}, bad(i, "", "must be a JSON object: %v", err)
	}
	opRaw, ok := m["op"]
	if !ok {
		return Operation{}, bad(i, "op", "is required: one of %s", strings.Join(opNames, ", "))
	}
	name, err := str(opRaw)
	if err != nil {
		return Operation{}, bad(i, "op", "%v", err)
	}
	allowed, known := fields[name]
	if !known {
		return Operation{}, bad(i, "op", "unknown op %q: one of %s", name, strings.Join(opNames, ", "))
	}
	for _, k := range sortedKeys(m) {
		if _, ok := allowed[k]; !ok {
			return Operation{}, bad(i, k, "unknown field for %s; it takes %s", name, strings.Join(sortedKeys(allowed), ", "))
		}
	}
	for _, k := range sortedKeys(allowed) {
		if _, ok := m[k]; allowed[k] && !ok {
			return Operation{}, bad(i, k, "is required for %s", name)
		}
	}
	op := Operation{Op: name, Limit: 1}
	var e *BadRequest
	field := func(k string, parse func(json.RawMessage) error) {
		if raw, ok := m[k]; ok && e == nil {
			if err := parse(raw); err != nil {
				e = bad(i, k, "%v", err)
			}
		}
	}
	field("name", func(r json.RawMessage) (err error) {
		if op.Name, err = str(r); err != nil {
			return err
		}
		return permit.ValidateName(op.Name)
	})
	field("owner", func(r json.RawMessage) (err error) {
		if op.Owner, err = str(r); err != nil {
			return err
		}
		// The route writes with the manager's identity, which the permit
		// webhook lets name the gate's owners: the route refuses them to
		// its callers itself.
		return permit.ValidateOwnerOf(op.Owner)
	})
	field("ttlSeconds", func(r json.RawMessage) (err error) {
		op.TTLSeconds, err = integer(r, 1, permit.MaxTTLSeconds)
		return err
	})
	field("waitSeconds", func(r json.RawMessage) error {
		n, err := integer(r, 0, int64(MaxWait/time.Second))
		op.WaitSeconds = int(n)
		return err
	})
	field("limit", func(r json.RawMessage) error {
		n, err := integer(r, 1, permit.MaxLimit)
		op.Limit = int(n)
		return err
	})
	field("slot", func(r json.RawMessage) error {
		n, err := integer(r, 0, permit.MaxLimit-1)
		op.Slot = int(n)
		return err
	})
	field("token", func(r json.RawMessage) (err error) {
		op.Token, err = unsigned(r)
		return err
	})
	field("expect", func(r json.RawMessage) (err error) {
		op.Expect, err = unsigned(r)
		return err
	})
	return op, e
}

var wholeNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

func str(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", fmt.Errorf("must be a string, got %s", describe(raw))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("must be a string: %w", err)
	}
	if loneSurrogate(raw) {
		return "", fmt.Errorf(`must be a string of valid Unicode: a \u escape of a lone UTF-16 surrogate (\ud800 to \udfff not in a pair) names no character`)
	}
	return s, nil
}

// loneSurrogate tells whether the JSON string raw escapes half of a UTF-16
// surrogate pair without the other half. encoding/json turns such an
// escape into U+FFFD, so that different names would come out as one; the
// body is valid UTF-8 (checked first), so escapes are the only way in.
func loneSurrogate(raw json.RawMessage) bool {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		if !ok {
			i++ // a two-character escape, \\ among them
			continue
		}
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := hex4(i + 6); ok && lo >= 0xDC00 && lo <= 0xDFFF {
				i += 11
				continue
			}
			return true
		case r >= 0xDC00 && r <= 0xDFFF:
			return true
		}
		i += 5
	}
	return false
}

// duplicateField is a member name an object gives twice.
type duplicateField string

func (d duplicateField) Error() string {
	return "is given twice; give each field once"
}

// object reads a JSON object's members. Unlike a decode into a map, it
// refuses a name given twice, which would otherwise keep the last value
// and drop the first without a word.
func object(raw json.RawMessage) (map[string]json.RawMessage, error) {
	if len(raw) == 0 || raw[0] != '{' {
		return nil, fmt.Errorf("got %s", describe(raw))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // {
		return nil, err
	}
	m := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := t.(string)
		if _, dup := m[k]; dup {
			return nil, duplicateField(k)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		m[k] = v
	}
	return m, nil
}

// integer reads a JSON whole number within [lo, hi]. A fraction, an exponent,
// a string or a null is refused rather than rounded or converted.
func integer(raw json.RawMessage, lo, hi int64) (int64, error) {
	s := string(raw)
	if !wholeNumber.MatchString(s) {
		return 0, fmt.Errorf("must be a whole number from %d to %d, got %s", lo, hi, describe(raw))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("must be a whole number from %d to %d, got %s", lo, hi, s)
	}
	return n, nil
}

func unsigned(raw json.RawMessage) (uint64, error) {
	s := string(raw)
	if !wholeNumber.MatchString(s) || s[0] == '-' {
		return 0, fmt.Errorf("must be a token, a positive whole number, got %s", describe(raw))
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("must be a token, a positive whole number below 2^64, got %s", s)
	}
	return n, nil
}

// describe names what a client sent, briefly, for an error message.
func describe(raw json.RawMessage) string {
	switch {
	case len(raw) == 0:
		return "nothing"
	case raw[0] == '"':
		return "a string"
	case raw[0] == '{':
		return "an object"
	case raw[0] == '[':
		return "an array"
	case string(raw) == "null":
		return "null"
	case string(raw) == "true" || string(raw) == "false":
		return "a boolean"
	}
	if len(raw) > 32 {
		return string(raw[:32]) + "..."
	}
	return string(raw)
}

// strictUnmarshal decodes exactly one JSON value and nothing after it.
func strictUnmarshal(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("data after the JSON object")
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
