// Command vmexec runs a test binary inside the test VM, for `go test -exec`:
// every test of the package then runs in one VM boot, with vm.InVM() true.
// The binary must be static:
//
//	CGO_ENABLED=0 go test -exec "go run github.com/vipcast/vipcast/test/vm/cmd/vmexec" ./ipvs/
//
// VIPCAST_VM_TIMEOUT (a Go duration, default 10m) bounds the run.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/vipcast/vipcast/test/vm"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: vmexec test-binary [args...]")
	}
	code, err := run(os.Args[1], os.Args[2:])
	if err != nil {
		log.Fatal(err)
	}
	os.Exit(code)
}

// run runs the test binary with args in a VM and returns its exit code.
func run(testBinary string, args []string) (int, error) {
	timeout := 10 * time.Minute
	if s := os.Getenv("VIPCAST_VM_TIMEOUT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("VIPCAST_VM_TIMEOUT: %w", err)
		}
		timeout = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+20*time.Minute)
	defer cancel()
	env, err := vm.Prepare(ctx, log.Printf)
	if err != nil {
		return 0, err
	}
	res, err := vm.RunContext(ctx, env, vm.Options{
		TestBinary: testBinary,
		Args:       args,
		Timeout:    timeout,
		Logf:       func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	if err != nil {
		return 0, err
	}
	return res.ExitCode, nil
}
