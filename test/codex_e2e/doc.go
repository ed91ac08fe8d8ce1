// Package codexe2e holds the end-to-end tests of the Codex CLI adapter:
// the real Codex CLI (installed by scripts/install-harnesses.sh into
// .tools/) driven by the real driver (driver.Runner and driver.Participant,
// in process), under the real static ngsup, in real local sandboxes (a
// mount namespace per exec, the sandbox's folder at /sandbox), lent by the
// real lending owner, with the project's fake model server (internal/fake/model,
// on the Responses API) standing in for the model.
//
// The tests prove: a run goes to a verified result with its NeMoGymResponse
// built from Codex's session file; a checkpoint taken mid-tool stops every
// process of Codex and of its tool (state T), changes no file of the
// sandbox and no CPU time, and the same Codex process finishes after it
// with no model call repeated; likewise mid-stream and while a reply is
// held (the reply waits unread in Codex's socket); two rollouts at once
// never touch each other's processes; a crash before any completed
// response starts fresh; with the resume_prompt opt-in a crash resumes
// with the added turn marked; after a crash following a mid-tool
// checkpoint the fork starts over fresh (Codex cannot continue a saved
// session without a new user turn, which a probe of `codex exec resume`
// on the saved session shows on the model's log), with the task the only
// user turn, byte for byte; a hostile task text (quotes, $(...),
// backticks, newlines, 100 KB) reaches the model byte for byte.
//
// TestMain builds the static ngsup. A test that needs Codex fails when it
// is missing and CI is set, and skips otherwise, naming the install
// script. The tests live in the _test.go files.
package codexe2e
