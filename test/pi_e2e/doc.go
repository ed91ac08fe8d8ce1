// Package pie2e holds the end-to-end tests of the Pi adapter: real Pi
// (@mariozechner/pi-coding-agent, installed by scripts/install-harnesses.sh
// into .tools/) run by real node through the adapter's launcher, driven by
// the real driver (driver.Runner and driver.Participant, in process), under
// the real static ngsup, in real local sandboxes (a mount namespace per
// exec, the sandbox's folder at /sandbox), lent by the real lending owner,
// with the project's fake model server (internal/fake/model, on chat
// completions) standing in for the model.
//
// The tests prove the matrix every real harness passes (matrix_test.go): a
// run goes to a verified result with its NeMoGymResponse built from Pi's
// session file; a checkpoint taken mid-tool, mid-stream or while a reply
// is held pauses every process of Pi and of its tool in place (state T),
// changes no file and no CPU time, and the same Pi finishes after it with
// no model call repeated; two rollouts at once never touch each other's
// processes; a crash before any completed response starts fresh; a
// hostile 100 KB task reaches the model byte for byte. And what is Pi's
// own (pi_test.go): after a crash following a mid-tool checkpoint the fork
// continues the saved session with Pi's own error result for the
// interrupted call and no added turn, its request the crashed one's plus
// exactly the call and that result; after a crash while the answer to a
// tool result was held, the fork's one request is the one in flight; a
// stop at a checkpoint (pause_at_checkpoints false) leaves no process of
// the stopped launch and is continued the same way. cli_test.go runs the
// by-hand `ngdriver run --adapter pi` path.
//
// TestMain builds the static ngsup and ngdriver. A test that needs Pi fails
// when it is missing and CI is set, and skips otherwise, naming the
// install script. The tests live in the _test.go files.
package pie2e
