package flood

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The flood starts the webhook port's attacker as a process of its own
// (this test binary again, running TestWebhookAttacker alone), told where
// to aim and for how long through these variables.
const (
	attackerEnv    = "QUEEN_LOCKS_FLOOD_WEBHOOK"
	attackerForEnv = "QUEEN_LOCKS_FLOOD_FOR"
)

// refusalsLine is how the attacker reports what it saw refused.
var refusalsLine = regexp.MustCompile(`webhook refusals seen by the attacker: (\d+)`)

// TestWebhookAttacker is the flood of the webhook port, run only as the
// child the flood starts: 7 MB bodies one byte short, half with their
// length and half chunked, and dribblers of a byte every 5 s; each from one
// of ten addresses, connecting again when cut off.
func TestWebhookAttacker(t *testing.T) {
	webhookAddr := os.Getenv(attackerEnv)
	if webhookAddr == "" {
		t.Skip("run by the flood as a process of its own")
	}
	d, err := time.ParseDuration(os.Getenv(attackerForEnv))
	if err != nil {
		t.Fatalf("%s: %v", attackerForEnv, err)
	}
	flood, stop := context.WithTimeout(context.Background(), d)
	defer stop()
	var wg sync.WaitGroup
	tlsCfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the attacker does not care whom it floods
	body := bytes.Repeat([]byte("a"), bigBody)
	var refusedBig atomic.Int64
	for i := range bigBodies {
		wg.Go(func() {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 4, byte(i%10+1))}}
			for flood.Err() == nil {
				c, err := tls.DialWithDialer(d, "tcp", webhookAddr, tlsCfg)
				if err != nil {
					continue
				}
				context.AfterFunc(flood, func() { c.Close() })
				if i%2 == 0 {
					fmt.Fprintf(c, "POST /validate-guarded HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", bigBody)
					_, _ = c.Write(body)
				} else {
					fmt.Fprintf(c, "POST /validate-guarded HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", bigBody)
					_, _ = c.Write(body)
				}
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					if resp.StatusCode >= 400 {
						refusedBig.Add(1)
					}
					resp.Body.Close()
				}
				c.Close()
				// Again after a second, as a pod retrying would.
				select {
				case <-flood.Done():
				case <-time.After(time.Second):
				}
			}
		})
	}
	for i := range dribblers {
		wg.Go(func() {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 5, byte(i%10+1))}}
			for flood.Err() == nil {
				c, err := d.DialContext(flood, "tcp", webhookAddr)
				if err != nil {
					continue
				}
				context.AfterFunc(flood, func() { c.Close() })
				for err == nil && flood.Err() == nil {
					_, err = c.Write([]byte{0x16})
					select {
					case <-flood.Done():
					case <-time.After(5 * time.Second):
					}
				}
				c.Close()
			}
		})
	}
	wg.Wait()
	fmt.Printf("webhook refusals seen by the attacker: %d\n", refusedBig.Load())
}

// attackerRefusals reads the attacker's report from its output.
func attackerRefusals(t *testing.T, out string) int64 {
	t.Helper()
	m := refusalsLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the webhook attacker gave no report:\n%s", out)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
