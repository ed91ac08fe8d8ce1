package opensandbox

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// DefaultMaxOutput is how many bytes of a command's stdout, and of its
// stderr, Exec reads back by default.
const DefaultMaxOutput = 16 << 20

// Script is the bash -c text Exec sends for line (a command line built by
// sandbox.CommandLine, every word quoted). execd's own events cannot carry
// a command's output (they are re-chunked by line, their line ends
// dropped, invalid UTF-8 replaced), nor its exit status (a signal is
// "-1"), and execd does not end a command whose client went away. So the
// script, with the files of the exec at tmp/ngx-NONCE.*:
//
//   - runs `sh -c LINE` as a job of its own (started under set -m: its own
//     process group), stdin from stdinFile (or /dev/null), stdout and
//     stderr to files, and writes the job's pid to the .pid file, unless
//     the .cancel file says the client already gave up (KillScript);
//   - enforces the timeout itself: a watcher (a job too) marks the .to
//     file and SIGKILLs the job's group once the timeout has passed, in
//     whole seconds; it checks every second that the script is still
//     there, so it never outlives it by more than a second;
//   - waits for the job to its end with job control off again, so that a
//     job stopped and continued (by itself, or by a snapshot freezing the
//     sandbox) is waited for to its end, and takes its exit status from
//     the shell (128+N for signal N). A job that stopped before job control
//     went off is in the shell's table as stopped, and wait reports it
//     stopped (147-150) at once (5 runs of 30 of a job that stops itself,
//     at a load of 250): while the table says so, the script waits again
//     every second; once the job is no longer listed stopped, one more
//     wait gives its own status (the shell remembers it; a command that
//     exited 147 itself keeps 147). bash 5.2's `wait -f` would do the
//     same but loops for good when the job ends while it waits;
//   - writes that status, and whether the watcher fired, to the .x file
//     (the nonce's exit file), then prints, as single lines of the
//     stream, the stdout and stderr base64-encoded (hex through od where
//     base64 is missing; neither holds a line end), or their size when
//     past maxOutput, then the status line; every line starts with the
//     nonce's marker, so nothing else can be taken for it;
//   - keeps its report (the .x, .out and .err files): a client whose
//     stream ended before the report came reads it from there (settle);
//     it removes its other files, and the reports of the client's earlier
//     execs that drop names (nonces whose report the client has), and,
//     for one nonce in 256, reports older than 10 minutes that no client
//     came back for.
func Script(line string, timeout time.Duration, tmp, nonce, stdinFile string, maxOutput int64, drop ...string) string {
	secs := int64(math.Ceil(timeout.Seconds()))
	if secs < 1 {
		secs = 1
	}
	q := sandbox.Quote
	t := q(tmp + "/ngx-" + nonce)
	in := "/dev/null"
	rmIn := ""
	if stdinFile != "" {
		in, rmIn = q(stdinFile), " "+q(stdinFile)
	}
	var old strings.Builder
	for _, n := range drop {
		if validNonce(n) {
			p := q(tmp + "/ngx-" + n)
			fmt.Fprintf(&old, " %[1]s.out %[1]s.err %[1]s.x", p)
		}
	}
	sweep := ""
	if strings.HasPrefix(nonce, "00") {
		sweep = "\n" + sweepStale(tmp)
	}
	return fmt.Sprintf(`exec 2>/dev/null </dev/null
t=%[1]s m='@ngx-%[2]s-'
if [ -e "$t.cancel" ]; then rm -f -- "$t.cancel"%[3]s; printf '%%sx:cancelled\n' "$m"; exit 0; fi
[ -d %[4]s ] || mkdir -p -- %[4]s || { printf '%%sfail:mkdir %%s\n' "$m" %[4]s; exit 0; }
set -m
sh -c %[5]s <%[6]s >"$t.out" 2>"$t.err" &
c=$!
echo "$c" >"$t.pid"
[ -e "$t.cancel" ] && kill -KILL -"$c"
(i=0; while [ "$i" -lt %[7]d ]; do sleep 1; kill -0 $$ || exit 0; i=$((i+1)); done; : >"$t.to"; kill -KILL -"$c") </dev/null >/dev/null 2>&1 &
w=$!
set +m
wait "$c"; rc=$?
while [ "$rc" -ge 147 ] && [ "$rc" -le 150 ]; do
  [[ $'\n'"$(jobs -sp)"$'\n' == *$'\n'"$c"$'\n'* ]] || { wait "$c"; rc=$?; break; }
  sleep 1; wait "$c"; rc=$?
done
rm -f -- "$t.pid"%[3]s
kill -KILL -"$w"
to=0; [ -e "$t.to" ] && to=1
printf -v x '%%sx:%%d:%%d' "$m" "$rc" "$to"
printf '%%s\n' "$x" >"$t.x"
for s in o e; do
  f="$t.out"; [ "$s" = e ] && f="$t.err"
  [ -s "$f" ] || continue
  n=$(($(wc -c <"$f")))
  if [ "$n" -gt %[8]d ]; then printf '%%s%%s:big:%%s\n' "$m" "$s" "$n"
  elif command -v base64 >/dev/null; then printf '%%s%%s:b:' "$m" "$s"; base64 <"$f" | tr -d '\r\n'; echo
  else printf '%%s%%s:x:' "$m" "$s"; od -An -v -tx1 <"$f" | tr -d ' \n'; echo
  fi
done
printf '%%s\n' "$x"
rm -f -- "$t.to" "$t.cancel"%[9]s%[10]s
exit 0`, t, nonce, rmIn, q(tmp), q(line), in, secs, maxOutput, old.String(), sweep)
}

// validNonce reports whether n is a nonce Exec makes (hex digits), so that
// a name built from it needs no quoting and reaches no other file.
func validNonce(n string) bool {
	if n == "" || len(n) > 64 {
		return false
	}
	for _, r := range n {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// sweepStale is the shell line that removes from tmp the reports (the .x
// files and the .out and .err beside them) older than 10 minutes: a client
// that has not come back for a report by then never will (it stopped, or
// the report came with a fork's files).
func sweepStale(tmp string) string {
	return fmt.Sprintf(`find %s -maxdepth 1 -name 'ngx-*.x' -mmin +10 -exec sh -c 'for x; do b=${x%%.x}; rm -f -- "$b.out" "$b.err" "$x"; done' sh {} +`, sandbox.Quote(tmp))
}

// KillScript is the bash -c text that ends the Script run with nonce from
// the client's side: it leaves the .cancel file (so a script that has not
// started yet never runs its command, and one that has kills it) and
// SIGKILLs the group of the job whose pid the script wrote (removed as
// soon as the job is reaped, so a pid reused since is never signalled),
// then removes the exec's files but the .cancel one (the script removes
// it when it ends, or finds it when it starts). It also removes .cancel
// files older than 10 minutes (left by a kill that came after its command
// ended, or whose script died), and the reports older than 10 minutes
// (sweepStale).
func KillScript(tmp, nonce string) string {
	q := sandbox.Quote
	t := q(tmp + "/ngx-" + nonce)
	return fmt.Sprintf(`exec 2>/dev/null </dev/null
t=%[1]s
[ -d %[2]s ] || mkdir -p -- %[2]s
: >"$t.cancel"
[ -f "$t.pid" ] && kill -KILL -"$(cat "$t.pid")"
rm -f -- "$t.pid" "$t.out" "$t.err" "$t.to" "$t.in" "$t.x"
find %[2]s -maxdepth 1 -name 'ngx-*.cancel' -mmin +10 -exec rm -f -- {} +
%[3]s
exit 0`, t, q(tmp), sweepStale(tmp))
}

// report is what a Script printed.
type report struct {
	// ended: the status line came; cancelled: the script found the
	// .cancel file and ran nothing.
	ended, cancelled bool
	exitCode         int
	timedOut         bool
	stdout, stderr   []byte
	// big names a stream past the cap, with its size.
	big  string
	fail string
}

// parseReport reads a Script's lines out of the text of its stdout events
// (joined as they came: line ends dropped or not).
func parseReport(text []byte, nonce string) (report, error) {
	var r report
	mark := []byte("@ngx-" + nonce + "-")
	parts := bytes.Split(text, mark)
	for _, p := range parts[1:] {
		f := string(bytes.TrimSpace(p))
		kind, rest, _ := strings.Cut(f, ":")
		switch kind {
		case "o", "e":
			enc, data, _ := strings.Cut(rest, ":")
			var b []byte
			var err error
			switch enc {
			case "b":
				b, err = base64.StdEncoding.DecodeString(data)
			case "x":
				b, err = hex.DecodeString(data)
			case "big":
				name := map[string]string{"o": "stdout", "e": "stderr"}[kind]
				r.big = strings.TrimSpace(r.big + " " + name + " is " + data + " bytes")
				continue
			default:
				err = fmt.Errorf("unknown encoding %q", enc)
			}
			if err != nil {
				return r, fmt.Errorf("the command's output came back garbled: %v", err)
			}
			if kind == "o" {
				r.stdout = b
			} else {
				r.stderr = b
			}
		case "x":
			if rest == "cancelled" {
				r.cancelled = true
				continue
			}
			code, to, _ := strings.Cut(rest, ":")
			n, err := strconv.Atoi(code)
			if err != nil {
				return r, fmt.Errorf("the command's status line %q is not a number", f)
			}
			r.ended, r.exitCode, r.timedOut = true, n, to == "1"
		case "fail":
			r.fail = rest
		}
	}
	return r, nil
}
