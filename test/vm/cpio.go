package vm

import (
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// cpioWriter writes a "newc" (SVR4, no CRC) cpio archive, the format the
// Linux kernel unpacks as an initramfs. Several archives may be concatenated
// in one initrd; the kernel unpacks them in order.
type cpioWriter struct {
	w    io.Writer
	off  int64
	ino  uint32
	dirs map[string]bool
	err  error
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: w, ino: 1000, dirs: map[string]bool{"": true, ".": true, "/": true}}
}

const (
	cpioModeDir  = 0o040000
	cpioModeReg  = 0o100000
	cpioModeChr  = 0o020000
	cpioModeLink = 0o120000
)

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.off += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.off % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// header writes one entry header; name is relative ("dev/console").
func (c *cpioWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == cpioModeDir {
		nlink = 2
	}
	// newc sizes are 32-bit: CopyFile refuses larger files, and the other
	// entries (directories, links, generated files) are small.
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, uint32(size), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0) //nolint:gosec // see above
	c.write([]byte(hdr))
	c.write([]byte(name))
	c.write([]byte{0})
	c.pad()
}

func cleanName(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

// Dir adds a directory and its missing parents.
func (c *cpioWriter) Dir(name string) {
	name = cleanName(name)
	if c.dirs[name] {
		return
	}
	c.Dir(path.Dir(name))
	c.dirs[name] = true
	c.header(name, cpioModeDir|0o755, 0, 0, 0)
}

// File adds a regular file with the given content.
func (c *cpioWriter) File(name string, mode uint32, data []byte) {
	name = cleanName(name)
	c.Dir(path.Dir(name))
	c.header(name, cpioModeReg|mode&0o7777, int64(len(data)), 0, 0)
	c.write(data)
	c.pad()
}

// CopyFile adds the host file src as name, streaming its content.
func (c *cpioWriter) CopyFile(name string, mode uint32, src string) {
	if c.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		c.err = err
		return
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		c.err = err
		return
	}
	if st.Size() > 1<<32-1 {
		c.err = fmt.Errorf("cpio: %s too large", src)
		return
	}
	name = cleanName(name)
	c.Dir(path.Dir(name))
	c.header(name, cpioModeReg|mode&0o7777, st.Size(), 0, 0)
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, f)
	c.off += n
	if err == nil && n != st.Size() {
		err = fmt.Errorf("cpio: %s changed while copying", src)
	}
	c.err = err
	c.pad()
}

// Symlink adds a symbolic link name -> target.
func (c *cpioWriter) Symlink(name, target string) {
	name = cleanName(name)
	c.Dir(path.Dir(name))
	c.header(name, cpioModeLink|0o777, int64(len(target)), 0, 0)
	c.write([]byte(target))
	c.pad()
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, mode, major, minor uint32) {
	name = cleanName(name)
	c.Dir(path.Dir(name))
	c.header(name, cpioModeChr|mode&0o7777, 0, major, minor)
}

// Close writes the trailer. It does not close the underlying writer.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	return c.err
}
