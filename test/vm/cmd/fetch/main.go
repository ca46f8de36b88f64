// Command fetch prepares the test VM ahead of time: it downloads and
// extracts the Debian kernel into $VIPCAST_CACHE, installs qemu when missing,
// builds the module part of the initramfs and the guest /init.
//
//	go run ./test/vm/cmd/fetch
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
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	env, err := vm.Prepare(ctx, log.Printf)
	if err != nil {
		return err
	}
	mods, err := env.Kernel.ModulesCPIO(vm.DefaultModules, vm.OptionalModules)
	if err != nil {
		return fmt.Errorf("initramfs modules: %w", err)
	}
	// Warms the Go build cache for the guest /init.
	if _, err := vm.BuildInit(); err != nil {
		return fmt.Errorf("guest /init: %w", err)
	}
	_, err = fmt.Fprintf(os.Stdout, "kernel:  %s %s (%s)\nvmlinux: %s\nmodules: %s\nqemu:    %s (accel %s)\nready in %s\n",
		env.Kernel.Package, env.Kernel.Version, env.Kernel.Release, env.Kernel.Vmlinux, mods,
		env.QEMU, env.Accel, time.Since(start).Round(time.Millisecond))
	return err
}
