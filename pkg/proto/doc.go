// Package proto is what crosses between ngdriver and ngsup: the launch
// folder's file names, the receipt ngsup keeps on the sandbox's disk, the one
// line of JSON each verb prints, and the exit codes.
//
// docs/ngsup.md is the contract in full. Pause and continue take --dir
// more than once. With one --dir nothing changes (one line, the verb's exit
// code). With several, each launch is handled as if named alone, and one
// line per --dir is printed in the order given (PauseLine, ContinueLine:
// the verb's result plus "dir" and "code", the exit code that launch alone
// would have had); the process exits 0 when every code is 0, else the
// largest code. --id names one launch and is refused with several --dir
// (exit 2). ngdriver uses it to pause and continue the launches of one host
// with one ngsup process.
//
// Both binaries import it and nothing else of each other, so that a change to
// the contract is a change in one place. It must stay small and free of
// process logic: ngsup is statically linked and uploaded into every sandbox.
package proto
