// Command lister stands for the program the sandbox runs: built static by
// the sandbox's tests, it enters the sandbox as kyb-cuda-probe does, then
// prints what it finds there, one line per path: its type (d, f, c with
// its numbers, l), whether it is writable (rw, ro), and the path; the
// kernel's file systems (/proc, /sys) are listed by their mount points
// only. Then it prints what it finds of the kernel, one fact a line
// ("pid 1", "fs /dev/shm tmpfs 67108864", "write /dev/null: ok").
package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"unsafe"

	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == sandbox.EnterArg {
		err := sandbox.Enter(os.Args[2])
		fmt.Fprintln(os.Stderr, "lister:", err)
		os.Exit(sandbox.ExitCode(err))
	}
	if err := list(); err != nil {
		fmt.Fprintln(os.Stderr, "lister:", err)
		os.Exit(1)
	}
	facts()
}

func list() error {
	return filepath.WalkDir("/", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			return err
		}
		mode := "rw"
		if err := syscall.Access(path, 2); errors.Is(err, syscall.EROFS) {
			mode = "ro"
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			fmt.Printf("d %s %s\n", mode, path)
			if path == "/proc" || path == "/sys" {
				return filepath.SkipDir
			}
		case syscall.S_IFCHR:
			fmt.Printf("c %d:%d %s\n", st.Rdev>>8&0xfff, st.Rdev&0xff|st.Rdev>>12&0xfff00, path)
		case syscall.S_IFLNK:
			fmt.Printf("l %s\n", path)
		default:
			fmt.Printf("f %s %s\n", mode, path)
		}
		return nil
	})
}

// fsTypes name the file systems a container's program meets.
var fsTypes = map[int64]string{0x9fa0: "proc", 0x62656572: "sysfs", 0x01021994: "tmpfs", 0x1cd1: "devpts"}

func facts() {
	fmt.Printf("pid %d\n", os.Getpid())
	self, err := os.Readlink("/proc/self")
	fmt.Printf("proc self %s%s\n", self, errText(err))
	entries, err := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	fmt.Printf("proc pids %v%s\n", pids, errText(err))
	for _, p := range []string{"/proc", "/sys", "/dev", "/dev/pts", "/dev/shm"} {
		var st syscall.Statfs_t
		if err := syscall.Statfs(p, &st); err != nil {
			fmt.Printf("fs %s%s\n", p, errText(err))
			continue
		}
		fmt.Printf("fs %s %s %d\n", p, fsTypes[st.Type], st.Blocks*uint64(st.Bsize))
	}
	fmt.Printf("write /dev/null%s\n", errText(write("/dev/null")))
	fmt.Printf("write /dev/full%s\n", errText(write("/dev/full")))
	for _, p := range []string{"/dev/zero", "/dev/random", "/dev/urandom"} {
		b, err := read(p)
		fmt.Printf("read %s %d bytes, %d zero%s\n", p, len(b), len(b)-len(slices.DeleteFunc(b, func(c byte) bool { return c == 0 })), errText(err))
	}
	fmt.Printf("pty %s\n", pty())
}

func errText(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	if err != nil {
		return ": " + err.Error()
	}
	return ": ok"
}

func write(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte("x"))
	_ = f.Close()
	return err
}

func read(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	b := make([]byte, 16)
	n, err := f.Read(b)
	return b[:n], err
}

// pty opens a pseudo-terminal as a program does, through /dev/ptmx, and
// names its other end.
func pty() string {
	f, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		return e.Error()
	}
	if _, err := os.Stat("/dev/pts/" + strconv.Itoa(int(n))); err != nil {
		return err.Error()
	}
	return "/dev/pts/" + strconv.Itoa(int(n))
}
