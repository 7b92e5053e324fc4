package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/queen-locks/queen-locks/permit"
)

const guardUsage = `Usage: queenlock guard NAME [--label | --annotation] [--deletable] [-o lines|json]

Inside queenlock run NAME, prints the label and the annotation that fence a
Kubernetes write with the current token, from run's own state (the token
file it rewrites at every renew, else QUEEN_LOCK_TOKEN); the server is never
asked. Lines of KEY=VALUE, as kubectl label and kubectl annotate take them:

  locks.queen.dev/guarded=true
  locks.queen.dev/guard=NAME#SLOT=TOKEN

  --label        only the label line
  --annotation   only the annotation line (and the mark, with --deletable)
  --deletable    also locks.queen.dev/deletable=true, the mark a delete needs
  -o json        {"labels":{...},"annotations":{...}}

Exit status: 0 printed; 2 bad usage; 3 not inside a run holding NAME.
`

// guardCmd is `queenlock guard NAME`: the guard of the holding of the
// queenlock run it runs under. It reads only what run handed its command:
// a guard asked of the server would be handed to any caller.
func guardCmd(e Env, args []string) (int, error) {
	fs := flag.NewFlagSet("guard", flag.ContinueOnError)
	labelOnly := fs.Bool("label", false, "print only the label")
	annotationOnly := fs.Bool("annotation", false, "print only the annotation")
	deletable := fs.Bool("deletable", false, "also print the deletable mark")
	output := fs.String("o", "lines", "lines or json")
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(e.Stdout, guardUsage)
		return ExitOK, nil
	}
	name, rest, err := parse(fs, args, true)
	switch {
	case err != nil:
		return 0, err
	case len(rest) > 0:
		return 0, usageError("unexpected arguments %q", rest)
	case *labelOnly && *annotationOnly:
		return 0, usageError("--label and --annotation: give one, or neither for both")
	case *output != "lines" && *output != "json":
		return 0, usageError("-o %q: want lines or json", *output)
	}
	g, why := heldGuard(e, name)
	if why != "" {
		fmt.Fprintf(e.Stderr, "queenlock guard: %s\n", why)
		return ExitNotHeld, nil
	}
	labels := map[string]string{permit.GuardedLabel: "true"}
	annotations := map[string]string{permit.GuardAnnotation: g.String()}
	if *deletable {
		annotations[permit.DeletableAnnotation] = "true"
	}
	if *labelOnly {
		annotations = nil
	}
	if *annotationOnly {
		labels = nil
	}
	if *output == "json" {
		out := map[string]map[string]string{}
		if labels != nil {
			out["labels"] = labels
		}
		if annotations != nil {
			out["annotations"] = annotations
		}
		enc := json.NewEncoder(e.Stdout)
		return ExitOK, enc.Encode(out)
	}
	var b strings.Builder
	for _, kv := range [][2]string{
		{permit.GuardedLabel, labels[permit.GuardedLabel]},
		{permit.GuardAnnotation, annotations[permit.GuardAnnotation]},
		{permit.DeletableAnnotation, annotations[permit.DeletableAnnotation]},
	} {
		if kv[1] != "" {
			fmt.Fprintf(&b, "%s=%s\n", kv[0], kv[1])
		}
	}
	_, err = fmt.Fprint(e.Stdout, b.String())
	return ExitOK, err
}

// heldGuard is the guard of the run this process runs under, holding name,
// or why there is none.
func heldGuard(e Env, name string) (permit.Guard, string) {
	held := e.Getenv("QUEEN_LOCK_NAME")
	switch {
	case held == "":
		return permit.Guard{}, fmt.Sprintf("lock %q is not held here: QUEEN_LOCK_NAME is not set, so this is not a command of queenlock run %s; the guard comes only from the holder's own state", name, name)
	case held != name:
		return permit.Guard{}, fmt.Sprintf("lock %q is not held here: this queenlock run holds %q", name, held)
	}
	slot, err := strconv.Atoi(e.Getenv("QUEEN_LOCK_SLOT"))
	if err != nil || permit.ValidateSlot(int64(slot), permit.MaxLimit) != nil {
		return permit.Guard{}, fmt.Sprintf("QUEEN_LOCK_SLOT=%q is not a slot", e.Getenv("QUEEN_LOCK_SLOT"))
	}
	// The file is rewritten at every renew; the variable is the first
	// token. An older token is safe to send (the webhook refuses it), so
	// the variable stands in when the file cannot be read.
	raw := e.Getenv("QUEEN_LOCK_TOKEN")
	if path := e.Getenv("QUEEN_LOCK_TOKEN_FILE"); path != "" {
		if b, err := os.ReadFile(path); err == nil {
			raw = strings.TrimSpace(string(b))
		} else {
			fmt.Fprintf(e.Stderr, "queenlock guard: reading the token file: %v; using QUEEN_LOCK_TOKEN, the run's first token\n", err)
		}
	}
	token, err := permit.Token(raw)
	if err != nil {
		return permit.Guard{}, fmt.Sprintf("lock %q: no token: QUEEN_LOCK_TOKEN=%q and the token file give none", name, e.Getenv("QUEEN_LOCK_TOKEN"))
	}
	return permit.Guard{Lock: name, Slot: slot, Token: token}, ""
}
