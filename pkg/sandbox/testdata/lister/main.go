// Command lister stands for the program the sandbox runs: built static by
// the sandbox's tests, it enters the sandbox as kyb-cuda-probe does, then
// prints what it finds there, one line per path: its type (d, f, c with
// its numbers), whether it is writable (rw, ro), and the path.
package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == sandbox.EnterArg {
		err := sandbox.Enter(os.Args[2])
		fmt.Fprintln(os.Stderr, "lister:", err)
		os.Exit(sandbox.ExitCode(err))
	}
	err := filepath.WalkDir("/", func(path string, d fs.DirEntry, err error) error {
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
		case syscall.S_IFCHR:
			fmt.Printf("c %d:%d %s\n", st.Rdev>>8&0xfff, st.Rdev&0xff|st.Rdev>>12&0xfff00, path)
		case syscall.S_IFLNK:
			fmt.Printf("l %s\n", path)
		default:
			fmt.Printf("f %s %s\n", mode, path)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "lister:", err)
		os.Exit(1)
	}
}
