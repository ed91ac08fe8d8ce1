// Package harness is the adapter SDK: everything an adapter (what is
// harness-specific: where the harness keeps its session, how it is
// launched, whether a saved session can be continued, what verify needs)
// implements and uses, and nothing of the driver that runs it.
//
// adapter.go is the contract: the Adapter interface and its optional
// PausesAtCheckpoints and GymResulter, the lent sandbox an adapter works
// in (LentSandbox), what it gets for a launch (LaunchContext) and returns
// (LaunchSpec), its resume Decision and the HarnessResult it collects the
// response from. kit.go holds the helpers of command-line harnesses (the
// state folder, the task as one argument, the newest session file, the
// session's JSON lines kept and read back for Gym); options.go their
// shared options (CLIOptions, with one Check).
//
// The package imports only pkg/driver/sandbox (what a sandbox is) and
// pkg/gym (the NeMoGymResponse types), never pkg/driver: the driver's
// stage machine (pkg/driver.Runner) calls adapters through this contract,
// and an adapter never sees the Runner or the checkpoint participant.
// Adapters: pkg/claude, pkg/codex, pkg/opencode, pkg/pi, pkg/driver/fake.
package harness
