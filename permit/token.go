package permit

import (
	"fmt"
	"strconv"
)

// Token reads a permit's fencing token from its resourceVersion. Kubernetes
// 1.35 and later promise that the resourceVersions of one resource are
// comparable unsigned integers; anything else is refused rather than handed
// out as a token nobody can compare.
func Token(resourceVersion string) (uint64, error) {
	if resourceVersion == "" || resourceVersion[0] == '0' {
		return 0, fmt.Errorf("resourceVersion %q is not a positive integer without leading zeros", resourceVersion)
	}
	t, err := strconv.ParseUint(resourceVersion, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resourceVersion %q is not a comparable integer: %w", resourceVersion, err)
	}
	return t, nil
}

// ResourceVersion is the resourceVersion that a token was read from.
func ResourceVersion(token uint64) string { return strconv.FormatUint(token, 10) }
