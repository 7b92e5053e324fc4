package controllers_test

import (
	"os"
	"testing"

	"github.com/queen-locks/queen-locks/internal/controlplane"
)

var env *controlplane.Env

func TestMain(m *testing.M) {
	os.Exit(controlplane.TestMain(m, controlplane.Options{}, func(e *controlplane.Env) { env = e }))
}
