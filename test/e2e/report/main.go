// Command report is the job make e2e's CronJob runs under `queenlock run`:
// it prints when it starts and ends, with the lock's token, and works (sleeps)
// for -for in between. The test reads these lines from the pods' logs to
// check that no two runs ever overlapped.
package main

import (
	"encoding/json"
	"flag"
	"os"
	"time"
)

// Line is one line of the report's output.
type Line struct {
	Event string    `json:"event"` // "start" or "end"
	Pod   string    `json:"pod"`
	Token string    `json:"token"`
	At    time.Time `json:"at"`
}

func main() {
	d := flag.Duration("for", time.Minute, "How long the report works.")
	flag.Parse()
	enc := json.NewEncoder(os.Stdout)
	line := func(event string) {
		_ = enc.Encode(Line{Event: event, Pod: os.Getenv("HOSTNAME"), Token: os.Getenv("QUEEN_LOCK_TOKEN"), At: time.Now().UTC()})
	}
	line("start")
	time.Sleep(*d)
	line("end")
}
