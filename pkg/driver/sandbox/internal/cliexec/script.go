package cliexec

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Nonce returns a fresh random word for the markers and the tag of one
// command.
func Nonce() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TagEnv tags every process of a Script run with its nonce, from the
// script's first instant until the command itself (which does not inherit
// it), so KillScript finds them by the tag alone.
const TagEnv = "NGX_EXEC"

// Fence is the file in the sandbox's folder dir (its ngharness root,
// removed with it) whose presence tells the Script run with nonce that it
// was cancelled before it began: it then runs nothing.
func Fence(dir, nonce string) string { return path.Join(dir, ".ngx-cancel-"+nonce) }

// Script returns the sh -c script that runs line (a command line whose
// every word is quoted) in the sandbox. It first re-executes itself tagged
// with the nonce (TagEnv), so that every process it makes carries the tag
// from the start; then, unless KillScript fenced it off already, it prints
// a start marker on stderr, runs line under `timeout -s KILL` (in a
// process group of its own) when the sandbox has timeout(1), and prints an
// end marker with its exit code on stderr. The nonce makes the markers
// unguessable by the command's own output. fence is its Fence.
func Script(line string, timeout time.Duration, nonce, fence string) string {
	secs := int64(math.Ceil(timeout.Seconds()))
	if secs < 1 {
		secs = 1
	}
	cmd := sandbox.Quote("unset " + TagEnv + "; " + line)
	f := sandbox.Quote(fence)
	// The script's own stderr goes to /dev/null (a shell reports a child
	// killed by a signal on its stderr); the markers and the command (in a
	// subshell that restores fds 0 and 2 and execs it) get the originals.
	// The command runs as a job so that the script can wait for it; a
	// job's stdin would be /dev/null, hence fd 4.
	inner := fmt.Sprintf(`exec 3>&2 2>/dev/null 4<&0
if [ -e %[4]s ]; then rm -f %[4]s; exit 137; fi
printf '\036ngx-%[1]s-start\n' >&3
(exec 2>&3 3>&- 0<&4 4<&-; if command -v timeout >/dev/null 2>&1; then exec timeout -s KILL %[2]d sh -c %[3]s; else exec sh -c %[3]s; fi) &
ngx_pid=$!
exec 4<&-
wait "$ngx_pid"
ngx_rc=$?
printf '\n\036ngx-%[1]s-end %%d\n' "$ngx_rc" >&3
exit "$ngx_rc"`, nonce, secs, cmd, f)
	return fmt.Sprintf("exec env %s=%s sh -c %s", TagEnv, nonce, sandbox.Quote(inner))
}

// KillScript is the sh -c script that ends the Script run with nonce
// wherever it got to: it fences off a script that has not begun yet (see
// Script), then kills, with their process groups, the processes carrying
// the tag, again until none is left (a process forked meanwhile is caught
// by the next round). What left the groups (setsid) is not touched. Only
// when it found the script does it remove the fence; otherwise the script
// removes it if it ever begins. fence is the script's Fence (where it
// cannot be written, the fence is skipped: a script that begins after the
// kill script then runs).
func KillScript(nonce, fence string) string {
	return fmt.Sprintf(`f=%[1]s; : >"$f" 2>/dev/null
n=0
while [ "$n" -lt 100 ]; do
  ps=$(grep -l -F -e %[2]s /proc/[0-9]*/environ 2>/dev/null)
  [ -n "$ps" ] || break
  for e in $ps; do p=${e#/proc/}; p=${p%%/environ}; kill -KILL -"$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done
  n=$((n+1))
done
[ "$n" -eq 0 ] || rm -f "$f"`, sandbox.Quote(fence), sandbox.Quote(TagEnv+"="+nonce))
}

// Outcome is what the markers of a Script said.
type Outcome struct {
	// Started: the script began in the sandbox. Ended: it reported the
	// command's exit code, ExitCode.
	Started, Ended bool
	ExitCode       int
	// Stderr is the command's own stderr (markers removed). Client is what
	// the client printed on stderr outside the script (its own errors).
	Stderr, Client []byte
}

// Parse reads the markers of a Script run with nonce out of stderr.
func Parse(stderr []byte, nonce string) Outcome {
	start := []byte("\x1engx-" + nonce + "-start\n")
	end := []byte("\n\x1engx-" + nonce + "-end ")
	var o Outcome
	i := bytes.Index(stderr, start)
	if i < 0 {
		o.Client = stderr
		return o
	}
	o.Started = true
	o.Client = append([]byte(nil), stderr[:i]...)
	rest := stderr[i+len(start):]
	o.Stderr = rest
	j := bytes.LastIndex(rest, end)
	if j < 0 {
		return o
	}
	tail := rest[j+len(end):]
	k := bytes.IndexByte(tail, '\n')
	if k < 0 {
		return o
	}
	code, err := strconv.Atoi(string(tail[:k]))
	if err != nil {
		return o
	}
	o.Ended, o.ExitCode = true, code
	o.Stderr = rest[:j]
	o.Client = append(o.Client, tail[k+1:]...)
	return o
}

// UploadLine is the command line that writes its stdin to path with mode:
// into a temporary file beside it (the folders made first), then renamed
// over it; the temporary file is removed if a step fails.
func UploadLine(path string, mode uint32) string {
	dir := path[:strings.LastIndexByte(path, '/')+1]
	if dir == "" {
		dir = "/"
	}
	tmp := dir + ".upload-" + Nonce()[:12]
	q := sandbox.Quote
	return fmt.Sprintf("mkdir -p -- %s && cat > %s && chmod %o %s && mv -f -- %s %s || { rc=$?; rm -f -- %s; exit $rc; }",
		q(dir), q(tmp), mode&0o7777, q(tmp), q(tmp), q(path), q(tmp))
}
