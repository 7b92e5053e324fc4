package clients_test

// The PHP handle's own tests (PHPUnit) against the real route, and its
// agreement with the Go handle, the CLI and the Python and JavaScript
// handles on who holds a lock.

import (
	"regexp"
	"strconv"
	"testing"
)

func TestPHPHandle(t *testing.T) {
	out := runTests(t, "php", append([]string{"phpunit", "--configuration", "clients/php/phpunit.xml", "--testdox",
		"--fail-on-skipped", "--fail-on-incomplete", "--fail-on-risky", "--fail-on-warning"}, only("--filter")...)...)
	// With the route given nothing may be skipped, left incomplete or be
	// risky (a test that asserted nothing): each would hide a test that did
	// not run. PHPUnit 9 says so in its summary.
	if regexp.MustCompile(`(?m)^OK, but|(Skipped|Incomplete|Risky|Warnings): \d+`).MatchString(out) && only("") == nil {
		t.Fatal("phpunit skipped tests, left them incomplete or found them risky with the route given (see its summary above)")
	}
	m := regexp.MustCompile(`(?m)^OK \((\d+) tests?, \d+ assertions?\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("phpunit printed no OK summary")
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatal("phpunit ran no tests")
	}
}
