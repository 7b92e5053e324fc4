// Package loopback hands the harnesses loopback addresses to serve on.
package loopback

import (
	"net"
	"testing"
)

// FreeAddr is a loopback address with a port nothing listens on now. Some
// other process may take the port before the caller binds it; the
// harnesses bind it at once.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// FreeAddrT is FreeAddr for a test, which it fails when there is none.
func FreeAddrT(t testing.TB) string {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
