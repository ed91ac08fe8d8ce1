package local

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCopyFolderCopiesWhatCpACopies proves that the in-process copy of a
// sandbox's folder holds what `cp -a` makes of it: every kind of entry
// (folders of any mode, files with setuid and odd modes, empty and sparse
// files, symlinks absolute, relative, dangling and leading out, a FIFO, a
// socket, a device node when root, hard links within the tree), with the
// same owner, mode, times, extended attributes, link targets, data and
// links; and that it shares no file with the original (a write to the copy
// never shows in it), nor follows a symlink out of the tree.
func TestCopyFolderCopiesWhatCpACopies(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("outside\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mk := func(rel string, mode os.FileMode, data string) {
		t.Helper()
		p := filepath.Join(src, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("work/a.txt", 0o644, "a\n")
	mk("work/empty", 0o600, "")
	mk("work/run.sh", 0o755|os.ModeSetuid, "#!/bin/sh\n")
	mk(".ngharness/launches/l1/receipt", 0o444, `{"v":1}`)
	mk("home/.cfg", 0o640, strings.Repeat("x", 100000))
	must(t, os.Link(filepath.Join(src, "work/a.txt"), filepath.Join(src, "home/a-link")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(src, "work/abs")))
	must(t, os.Symlink("../home/.cfg", filepath.Join(src, "work/rel")))
	must(t, os.Symlink("nowhere", filepath.Join(src, "work/dangling")))
	must(t, os.Symlink(filepath.Dir(outside), filepath.Join(src, "work/out")))
	must(t, unix.Mkfifo(filepath.Join(src, "work/fifo"), 0o620))
	l, err := net.Listen("unix", filepath.Join(src, "work/sock"))
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if os.Geteuid() == 0 {
		must(t, unix.Mknod(filepath.Join(src, "work/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	}
	// A sparse file: 1 MiB of hole, 5 bytes, 1 MiB of hole.
	sp, err := os.Create(filepath.Join(src, "work/sparse"))
	if err != nil {
		t.Fatal(err)
	}
	sp.WriteAt([]byte("hello"), 1<<20)
	sp.Truncate(2<<20 + 5)
	sp.Close()
	if err := unix.Setxattr(filepath.Join(src, "work/a.txt"), "user.ngh", []byte("kept"), 0); err != nil {
		t.Logf("no user xattrs here (%v): not compared", err)
	}
	must(t, os.Mkdir(filepath.Join(src, "ro"), 0o555))
	must(t, os.Chmod(filepath.Join(src, "work"), 0o711))
	// Times set last, folders after their entries.
	old := time.Date(2020, 1, 2, 3, 4, 5, 123456789, time.UTC)
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{unix.NsecToTimespec(old.UnixNano()), unix.NsecToTimespec(old.UnixNano())}, unix.AT_SYMLINK_NOFOLLOW)
		}
		return nil
	})
	for _, d := range []string{"work", "home", ".ngharness/launches/l1", ".ngharness/launches", ".ngharness", "ro", "."} {
		os.Chtimes(filepath.Join(src, d), old, old)
	}

	viaCp := filepath.Join(t.TempDir(), "cp")
	if out, err := exec.Command("cp", "-a", "--reflink=auto", "-T", src, viaCp).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	ours := filepath.Join(t.TempDir(), "ours")
	must(t, os.Mkdir(ours, 0o700))
	if err := copyFolder(context.Background(), src, ours); err != nil {
		t.Fatal(err)
	}
	want, got := describeTree(t, viaCp), describeTree(t, ours)
	if want != got {
		t.Errorf("the copy differs from cp -a's\ncp -a:\n%s\nours:\n%s", want, got)
	}
	if data, _ := os.ReadFile(outside); string(data) != "outside\n" {
		t.Errorf("the file outside the tree changed: %q", data)
	}
	// Nothing shared with the original: a write to the copy stays there.
	must(t, os.Chmod(filepath.Join(ours, "work/a.txt"), 0o644))
	must(t, os.WriteFile(filepath.Join(ours, "work/a.txt"), []byte("changed\n"), 0o644))
	if data, _ := os.ReadFile(filepath.Join(src, "work/a.txt")); string(data) != "a\n" {
		t.Errorf("a write to the copy shows in the original: %q", data)
	}
	if data, _ := os.ReadFile(filepath.Join(ours, "home/a-link")); string(data) != "changed\n" {
		t.Errorf("the copy's hard link is not a link to the copy's file: %q", data)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// describeTree lists every entry of the tree with what a copy must keep:
// type and mode, owner, size, modification time, link target, data,
// extended attributes, device, the other names of a hard-linked file, and
// for a sparse file whether it stayed sparse.
func describeTree(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	inodes := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		inodes[st.Ino] = append(inodes[st.Ino], rel)
		line := fmt.Sprintf("%s mode=%o uid=%d gid=%d", rel, st.Mode, st.Uid, st.Gid)
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			line += fmt.Sprintf(" size=%d", st.Size)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			line += fmt.Sprintf(" mtime=%d", st.Mtim.Nano())
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case unix.S_IFREG:
			data, _ := os.ReadFile(p)
			line += fmt.Sprintf(" data=%x sparse=%v", sha(data), st.Blocks*512 < st.Size/2)
			buf := make([]byte, 256)
			if n, err := unix.Getxattr(p, "user.ngh", buf); err == nil {
				line += " xattr=" + string(bytes.TrimSpace(buf[:n]))
			}
		case unix.S_IFCHR, unix.S_IFBLK:
			line += fmt.Sprintf(" rdev=%d", st.Rdev)
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, names := range inodes {
		if len(names) > 1 {
			sort.Strings(names)
			lines = append(lines, "linked: "+strings.Join(names, " "))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func sha(data []byte) []byte {
	h := make([]byte, 0, 8)
	var x uint64 = 1469598103934665603
	for _, b := range data {
		x = (x ^ uint64(b)) * 1099511628211
	}
	for i := 0; i < 8; i++ {
		h = append(h, byte(x>>(8*i)))
	}
	return h
}
