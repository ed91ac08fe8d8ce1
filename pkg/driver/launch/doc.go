// Package launch is launch control: how the driver starts a harness inside
// a sandbox and holds it to its end through ngsup, by sandbox exec only.
//
// A Launcher starts and controls launches of one kind, and the launcher
// that started a launch controls it to its end: supervised by `ngsup run
// --detach` (Ngsup.Launcher(true)), or tagged only, the fallback when
// ngsup cannot supervise (Ngsup.Launcher(false): every process carries the
// launch's tag, and pause, continue and stop find them with `--id`).
// Ngsup uploads ngsup once per sandbox (Tools, for other helper binaries
// too), runs one verb and decodes its one line of JSON, retries what is
// safe to send again, and batches the pauses and continues of the
// launches of one host (sandbox.HostBatcher) into one command.
//
// Failures wrap the sentinels of errors.go; callers tell them apart with
// errors.Is. The package never imports pkg/driver: the driver's Runner
// uses it through Launchers.
package launch
