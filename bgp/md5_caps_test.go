package bgp_test

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMD5NeedsNoCapability backs the chart's capability list (NET_ADMIN
// only): setting a TCP MD5 key, as gobgp does for a BGPPeer with a
// password, works on a thread that holds no capability at all. As a
// control, SO_MARK (which needs CAP_NET_ADMIN or CAP_NET_RAW) is refused on
// that thread, so the capabilities really are gone.
func TestMD5NeedsNoCapability(t *testing.T) {
	errc := make(chan error, 1)
	go func() {
		// Capabilities are per thread: drop them all on this one, which
		// dies with the goroutine (no UnlockOSThread).
		runtime.LockOSThread()
		errc <- md5WithoutCapabilities()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func md5WithoutCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return fmt.Errorf("dropping the capabilities: %w", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("TCP socket: %w", err)
	}
	defer func() { _ = unix.Close(fd) }()
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, 1); !errors.Is(err, unix.EPERM) {
		return errors.New("SO_MARK without capabilities was not refused: the capabilities were not dropped")
	}
	sig := unix.TCPMD5Sig{Keylen: 6}
	sig.Addr.Family = unix.AF_INET
	copy(sig.Addr.Data[2:6], []byte{127, 0, 0, 1}) // after the port
	copy(sig.Key[:], "s3cret")
	if err := unix.SetsockoptTCPMD5Sig(fd, unix.IPPROTO_TCP, unix.TCP_MD5SIG, &sig); err != nil {
		return fmt.Errorf("TCP_MD5SIG without capabilities: %w", err)
	}
	return nil
}
