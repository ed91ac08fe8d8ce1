package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Shared tools. The driver's helper binaries (ngsup, ngresume) are static
// and the same for every sandbox of a host, so the backend keeps one copy
// of each in base/tools/<name>-<sha256 prefix> instead of one in every
// sandbox's folder: a snapshot and a fork copy only what the sandbox
// wrote. The copy is the backend's, not a sandbox's:
//   - it lives outside every sandbox's folder (no snapshot or fork carries
//     it, and no sandbox's writes land on it by its paths), mode 0555,
//     owned by the backend's user, in a folder (0755) only that user writes;
//   - with namespace isolation every command's namespace sees base/tools
//     through a read-only bind mount (writes there fail with EROFS);
//   - before a command runs a tool (a word of its argv), the backend
//     checks the file is still the content it installed: its identity
//     (device, inode, size, modification and change times) against the one
//     recorded when its content was last hashed, and the whole content
//     again when that changed; a file that is no longer the tool is
//     replaced by the content installed, before the command runs.
// Commands of a local sandbox run as the backend's user and can reach the
// host (the package's doc: no security boundary), so the check is what
// keeps one sandbox's code from changing the ngsup the host runs for
// another sandbox (HostPaths commands run the tool on the host).

// toolsFolder is the folder under the base that holds the shared tools.
const toolsFolder = "tools"

// toolIdentity is what changes when a file is written, replaced or
// touched: the device and inode, the size, and the modification and
// change times (the change time cannot be set back by a write).
type toolIdentity struct {
	dev, ino, size uint64
	mtime, ctime   unix.StatxTimestamp
	mode           uint16
	uid            uint32
}

// sharedTool is one installed tool: its content and the identity of the
// file as last verified.
type sharedTool struct {
	data []byte
	sum  string
	seen toolIdentity // zero until verified
}

// toolStore is the backend's shared tools, by host path.
type toolStore struct {
	mu    sync.Mutex
	tools map[string]*sharedTool
}

func (b *Backend) toolsDir() string { return filepath.Join(b.base, toolsFolder) }

// SharedTool implements sandbox.ToolSharer: the tool is installed once in
// the backend's tools folder (base/tools/<name>-<first 16 hex of sum>)
// and its host path returned, which is also its path inside every
// sandbox's namespace (read-only there). A file already there is used only
// when its content hashes to sum; anything else is replaced. name must be
// a plain name and sum the hex SHA-256 of data.
func (s *Sandbox) SharedTool(ctx context.Context, name string, data []byte, sum string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	return s.b.installTool(name, data, sum)
}

var _ sandbox.ToolSharer = (*Sandbox)(nil)

func (b *Backend) installTool(name string, data []byte, sum string) (string, error) {
	if err := CheckID("tool", name); err != nil {
		return "", err
	}
	sum = strings.ToLower(sum)
	if len(sum) != 64 {
		return "", fmt.Errorf("local: cannot install tool %s: %w (%q is not a hex SHA-256)", name, ErrToolSum, sum)
	}
	p := filepath.Join(b.toolsDir(), name+"-"+sum[:16])
	b.tools.mu.Lock()
	defer b.tools.mu.Unlock()
	if b.tools.tools == nil {
		b.tools.tools = map[string]*sharedTool{}
	}
	t := b.tools.tools[p]
	switch {
	case t == nil:
		// The content is hashed once, at its first install here.
		got := sha256.Sum256(data)
		if hex.EncodeToString(got[:]) != sum {
			return "", fmt.Errorf("local: cannot install tool %s: %w", name, ErrToolSum)
		}
		t = &sharedTool{data: data, sum: sum}
		b.tools.tools[p] = t
	case t.sum != sum:
		return "", fmt.Errorf("local: cannot install tool %s: %s holds another tool of the same name and sum prefix", name, p)
	case len(data) != len(t.data):
		return "", fmt.Errorf("local: cannot install tool %s: %w", name, ErrToolSum)
	}
	if err := b.verifyToolLocked(p, t); err != nil {
		return "", err
	}
	return p, nil
}

// checkTool verifies a tool a command is about to run (path is a word of
// its argv): nothing when it is not one of the backend's
// shared tools; otherwise the file must still be what was installed, and
// is put back when it is not.
func (b *Backend) checkTool(path string) error {
	if !strings.HasPrefix(path, b.toolsDir()+"/") {
		return nil
	}
	b.tools.mu.Lock()
	defer b.tools.mu.Unlock()
	t := b.tools.tools[filepath.Clean(path)]
	if t == nil {
		// Not installed by this process (another process of the same base
		// did): it is run only once installed here, with its content.
		return fmt.Errorf("local: cannot run %s: %w", path, ErrToolUnknown)
	}
	return b.verifyToolLocked(filepath.Clean(path), t)
}

// verifyToolLocked makes sure the file at p is the tool t (b.tools.mu
// held): unchanged since it was last verified, or hashing to its sum, or
// written again.
func (b *Backend) verifyToolLocked(p string, t *sharedTool) error {
	id, err := identifyTool(p)
	if err == nil && t.seen != (toolIdentity{}) && id == t.seen {
		return nil
	}
	if err == nil && id.mode&0o7777 == 0o555 && id.uid == uint32(os.Geteuid()) && id.mode&unix.S_IFMT == unix.S_IFREG {
		if ok, herr := hashIs(p, t.sum); herr == nil && ok {
			// Hashed after the stat: a write in between changed the
			// identity, which the next check sees.
			t.seen = id
			return nil
		}
	}
	if err := b.writeTool(p, t.data); err != nil {
		return fmt.Errorf("local: cannot install tool %s: %w", p, err)
	}
	if t.seen, err = identifyTool(p); err != nil {
		return fmt.Errorf("local: cannot install tool %s: %w", p, err)
	}
	return nil
}

// writeTool writes data to p: the tools folder made (0755), a temporary
// file in it (0555), synced, renamed over p.
func (b *Backend) writeTool(p string, data []byte) error {
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Only the backend's user may write the folder, whatever the umask or
	// an earlier chmod.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".new-"+filepath.Base(p)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // a no-op once renamed
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(0o555)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if err := errors.Join(werr, f.Close()); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}

// identifyTool stats p without following a symlink.
func identifyTool(p string) (toolIdentity, error) {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_SYNC_AS_STAT,
		unix.STATX_TYPE|unix.STATX_MODE|unix.STATX_UID|unix.STATX_INO|unix.STATX_SIZE|unix.STATX_MTIME|unix.STATX_CTIME, &st)
	if err != nil {
		return toolIdentity{}, &os.PathError{Op: "statx", Path: p, Err: err}
	}
	return toolIdentity{dev: unix.Mkdev(st.Dev_major, st.Dev_minor), ino: st.Ino, size: st.Size,
		mtime: st.Mtime, ctime: st.Ctime, mode: st.Mode, uid: st.Uid}, nil
}

// hashIs reports whether the regular file at p (not followed if a
// symlink) hashes to sum.
func hashIs(p, sum string) (bool, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, err
	}
	return hex.EncodeToString(h.Sum(nil)) == sum, nil
}
