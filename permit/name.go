package permit

import (
	"crypto/sha256"
	"encoding/base32"
	"strconv"
	"strings"
)

// LockLabel is the label every permit carries, so that the permits of one
// lock can be listed with a label selector. Its value is LabelValue(lock);
// two locks may share a label value, so a list must still compare spec.lock.
const LockLabel = "locks.queen.dev/lock"

const (
	maxReadable = 63 // a DNS label: the readable form keeps the lock name as it is
	maxSlug     = 40
	hashLen     = 26 // 130 bits of SHA-256 in base32
)

var hashEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// Name is the object name of slot of lock: permitName(lock, slot).
//
// A lock name that is a DNS label maps to "<lock>.<slot>", one dot. Any other
// name maps to "<slug>.<hash>.<slot>", two dots, where hash covers the whole
// name. The count of dots tells the two forms apart, and within each form the
// lock is recovered exactly (readable) or up to a SHA-256 collision (hashed),
// so two different (lock, slot) pairs never share an object name. That is what
// makes exactly one create of a free slot win.
func Name(lock string, slot int) string {
	s := strconv.Itoa(slot)
	if isDNSLabel(lock) {
		return lock + "." + s
	}
	return slug(lock) + "." + hash(lock) + "." + s
}

// LabelValue is the value of LockLabel for lock: the name itself when it is a
// valid label value, else a slug and a hash of it.
func LabelValue(lock string) string {
	if isLabelValue(lock) {
		return lock
	}
	return slug(lock) + "-" + hash(lock)[:16]
}

func hash(lock string) string {
	sum := sha256.Sum256([]byte(lock))
	return strings.ToLower(hashEncoding.EncodeToString(sum[:]))[:hashLen]
}

// slug keeps the DNS-safe characters of a name for readability: lowercase
// letters, digits and single dashes, never at either end.
func slug(lock string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(lock) {
		if b.Len() >= maxSlug {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
			continue
		}
		if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	s := strings.Trim(b.String(), "-")
	if s == "" {
		return "lock"
	}
	return s
}

func isDNSLabel(s string) bool {
	if s == "" || len(s) > maxReadable || !isAlnumLower(s[0]) || !isAlnumLower(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isAlnumLower(s[i]) && s[i] != '-' {
			return false
		}
	}
	return true
}

func isLabelValue(s string) bool {
	if s == "" || len(s) > 63 || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.' {
			return false
		}
	}
	return true
}

func isAlnumLower(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') }

func isAlnum(c byte) bool { return isAlnumLower(c) || (c >= 'A' && c <= 'Z') }
