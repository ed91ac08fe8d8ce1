// Package proto is what crosses between ngdriver and ngsup: the launch
// folder's file names, the receipt ngsup keeps on the sandbox's disk, the one
// line of JSON each verb prints, and the exit codes.
//
// Both binaries import it and nothing else of each other, so that a change to
// the contract is a change in one place. It must stay small and free of
// process logic: ngsup is statically linked and uploaded into every sandbox.
package proto
