//go:build kernel

package vm

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// copyWorkload is what BenchmarkGuestCopy's guests run (guestHelper, with
// VM_HELPER_COPY_MIB): it writes mib MiB to a file in $TMPDIR (the
// guest's tmpfs /tmp), reads
// it back and faults in mib MiB of fresh memory, the kernel's copy_user and
// clear_page at work, and prints each time.
func copyWorkload(mib int) {
	buf := make([]byte, 1<<20)
	start := time.Now()
	f, err := os.CreateTemp("", "copy-bench-")
	if err != nil {
		fmt.Println("guest copy:", err)
		return
	}
	name := f.Name()
	for range mib {
		_, _ = f.Write(buf)
	}
	_ = f.Close()
	write := time.Since(start)
	start = time.Now()
	f, err = os.Open(name) //nolint:gosec // the file this function just wrote

	if err != nil {
		fmt.Println("guest copy:", err)
		return
	}
	for {
		if n, err := f.Read(buf); n == 0 || err != nil {
			break
		}
	}
	_ = f.Close()
	_ = os.Remove(name)
	read := time.Since(start)
	start = time.Now()
	mem := make([]byte, mib<<20)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	fault := time.Since(start)
	fmt.Printf("guest copy: write %d fault %d read %d ns\n", write.Nanoseconds(), fault.Nanoseconds(), read.Nanoseconds())
}

var copyTimes = regexp.MustCompile(`guest copy: write (\d+) fault (\d+) read (\d+) ns`)

// BenchmarkGuestCopy boots a guest with TCGCPU and one with qemu's whole
// "max" CPU, each writing, reading and faulting in 64 MiB, and reports the
// time per MiB of each and their ratio: what hiding ERMS and FSRM from the
// guest saves its kernel under TCG (make bench).
func BenchmarkGuestCopy(b *testing.B) {
	if InVM() {
		b.Skip("host side only")
	}
	skipIfDisabled(b)
	env, err := prepareOnce()
	if err != nil {
		b.Fatal(err)
	}
	if env.Accel != "tcg" {
		b.Skip("TCGCPU applies under TCG only; accel is " + env.Accel)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin, err := TestBinary(ctx)
	if err != nil {
		b.Fatal(err)
	}
	const mib = 64
	perMiB := map[string][3]float64{}
	for range b.N {
		for _, cpu := range []string{TCGCPU, "max"} {
			res := Run(b, Options{TestBinary: bin, CPU: cpu, Timeout: 5 * time.Minute,
				Env: []string{"VM_HELPER_EXIT=0", "VM_HELPER_COPY_MIB=" + strconv.Itoa(mib)}})
			m := copyTimes.FindStringSubmatch(res.Output)
			if m == nil {
				b.Fatalf("-cpu %s: no copy times in the guest's output", cpu)
			}
			var t [3]float64
			for i := range t {
				ns, _ := strconv.ParseFloat(m[i+1], 64)
				t[i] = perMiB[cpu][i] + ns/mib/float64(b.N)
			}
			perMiB[cpu] = t
		}
	}
	for i, what := range []string{"write", "fault", "read"} {
		b.ReportMetric(perMiB[TCGCPU][i], what+"-ns/MiB")
		b.ReportMetric(perMiB["max"][i]/perMiB[TCGCPU][i], what+"-max/TCGCPU")
	}
}
