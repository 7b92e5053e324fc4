package permit

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The limits of the contract. Clients are written against them.
const (
	MaxNameBytes    = 256
	MaxOwnerBytes   = 256
	MaxTTLSeconds   = 31536000
	MaxLimit        = 1024
	MaxOperations   = 64
	MaxSlotsPerCall = 4096
)

// ValidateName reports what is wrong with a lock name, or nil.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("must not be empty")
	case len(name) > MaxNameBytes:
		return fmt.Errorf("must be at most %d bytes, got %d", MaxNameBytes, len(name))
	case !utf8.ValidString(name):
		return fmt.Errorf("must be valid UTF-8")
	}
	for i, r := range name {
		if r == '#' {
			return fmt.Errorf("must not contain '#' (byte %d)", i)
		}
		if unicode.IsControl(r) {
			return fmt.Errorf("must not contain a control character (U+%04X at byte %d)", r, i)
		}
	}
	return nil
}

// ValidateOwner reports what is wrong with an owner, or nil.
func ValidateOwner(owner string) error {
	switch {
	case owner == "":
		return fmt.Errorf("must not be empty")
	case len(owner) > MaxOwnerBytes:
		return fmt.Errorf("must be at most %d bytes, got %d", MaxOwnerBytes, len(owner))
	case !utf8.ValidString(owner):
		return fmt.Errorf("must be valid UTF-8")
	}
	// An owner is printed by kubectl get and the Locks page as it is: a
	// control character in it would reach the reader's terminal.
	for i, r := range owner {
		if unicode.IsControl(r) {
			return fmt.Errorf("must not contain a control character (U+%04X at byte %d)", r, i)
		}
	}
	return nil
}

// MaxMetadataBytes bounds the labels and the annotations of a permit that
// anyone but the manager writes, each counted as the bytes of its keys and
// values. The manager keeps every permit in memory: without a bound, a
// caller allowed to hold locks could fill it with annotations nobody reads.
const MaxMetadataBytes = 8192

// ValidateMetadata reports what is wrong with a permit's labels and
// annotations, each as a field error.
func ValidateMetadata(labels, annotations map[string]string) field.ErrorList {
	var errs field.ErrorList
	for _, m := range []struct {
		name string
		kv   map[string]string
	}{{"labels", labels}, {"annotations", annotations}} {
		n := 0
		for k, v := range m.kv {
			n += len(k) + len(v)
		}
		if n > MaxMetadataBytes {
			errs = append(errs, field.TooLong(field.NewPath("metadata", m.name), "", MaxMetadataBytes))
			errs[len(errs)-1].Detail = fmt.Sprintf("must total at most %d bytes of keys and values on a permit, got %d", MaxMetadataBytes, n)
		}
	}
	return errs
}

// GateOwnerPrefix begins the owners of gated pods' permits (pod:<uid>),
// which only the manager takes, for the pod the owner names: a permit of
// such an owner taken by anyone else would let the line believe the pod
// holds a lock it does not (SPEC section 6).
const GateOwnerPrefix = "pod:"

// ValidateOwnerOf reports what is wrong with an owner sent by a caller
// other than the manager: what ValidateOwner does, and the gate's prefix.
func ValidateOwnerOf(owner string) error {
	if err := ValidateOwner(owner); err != nil {
		return err
	}
	if strings.HasPrefix(owner, GateOwnerPrefix) {
		return fmt.Errorf("owners beginning %q are reserved for the queen-locks manager's gated pods; choose another owner", GateOwnerPrefix)
	}
	return nil
}

// ValidateTTL reports what is wrong with a lifetime in seconds, or nil.
func ValidateTTL(ttlSeconds int64) error {
	if ttlSeconds < 1 || ttlSeconds > MaxTTLSeconds {
		return fmt.Errorf("must be a whole number from 1 to %d, got %d", MaxTTLSeconds, ttlSeconds)
	}
	return nil
}

// ValidateLimit reports what is wrong with a semaphore limit, or nil.
func ValidateLimit(limit int64) error {
	if limit < 1 || limit > MaxLimit {
		return fmt.Errorf("must be from 1 to %d, got %d", MaxLimit, limit)
	}
	return nil
}

// ValidateSlot reports what is wrong with a slot of a semaphore of limit, or nil.
func ValidateSlot(slot, limit int64) error {
	if slot < 0 || slot >= limit {
		return fmt.Errorf("must be from 0 to limit-1 (%d), got %d", limit-1, slot)
	}
	return nil
}
