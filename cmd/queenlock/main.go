// Command queenlock runs a command under a lock and scripts locks from the
// shell. Installed as kubectl-queen it is also a kubectl plugin.
package main

import (
	"context"
	"os"

	"github.com/queen-locks/queen-locks/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), cli.Env{
		Args: os.Args[1:], Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
	}))
}
