// Package opencodee2e holds the end-to-end tests of the OpenCode adapter:
// real OpenCode (installed by scripts/install-opencode.sh into .tools/)
// driven by the real driver (driver.Runner and driver.Participant, in
// process), under the real static ngsup, in real local sandboxes (a mount
// namespace per exec, the sandbox's folder at /sandbox), lent by the real
// lending owner, with the project's fake OpenAI-compatible model server
// (internal/fake/model) standing in for the model.
//
// The tests prove what the issue asks of OpenCode at checkpoints: a launch
// paused mid-tool, mid-stream (the model's reply still arriving) or while a
// model reply is held changes nothing (files, opencode.db and its -wal and
// -shm, CPU times) and continues as the same process with no repeated
// model call; a launch is paused four times and still launched once; after
// a crash the fork of the snapshot is relaunched and the static resume
// helper (ngresume) re-enters the saved user turn, so the model sees the
// interrupted tool result and no user message is added; a saved session
// with no model response starts fresh; a python3 of 3.6 first on PATH does
// not break the relaunch; a session whose export is over 200 KB is read
// whole by the resume decision and the response; a rollout id holding '?',
// '#', '/' or '%' reaches the model on its own path; a hostile task of over
// 100 KB (quotes, $(...), backticks, newlines) reaches the model byte for
// byte and runs nowhere; each version has the CLI flags and server routes
// the adapter and ngresume use, and differs from the other as measured.
// One test documents a limit rather than a feature: time paused counts
// toward OpenCode's tool timeouts.
//
// Every test that needs OpenCode runs once per version of openCodeVersions
// (1.17.11 and 1.18.33), as a parallel subtest named for the version
// (TestPauseMidTool/1.18.33; -run 'TestX/1.18.33' runs one), against the
// binary scripts/install-opencode.sh installed for that version, which must
// report it. TestMain builds the static ngsup and ngresume, and prints one
// line for each version that is not installed; that version's subtests
// fail when CI is set and skip otherwise, naming the install script.
// OPENCODE_E2E_TOOLS names another folder of installs than .tools. The
// tests live in the _test.go files.
package opencodee2e
