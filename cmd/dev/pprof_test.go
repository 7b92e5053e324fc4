package main

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// The profiles show lock names and owners: only loopback may serve them.
func TestPprofIsServedOnLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "10.1.2.3:6060", "no-port"} {
		if err := servePprof(addr); err == nil {
			t.Errorf("%q was accepted", addr)
		}
	}
	if err := servePprof(""); err != nil {
		t.Errorf("empty serves none: %v", err)
	}
	// A free loopback port, then served there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := servePprof(addr); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine") {
		t.Errorf("answered %d: %.200s", resp.StatusCode, body)
	}
}
