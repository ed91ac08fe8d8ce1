package proto

import "errors"

// Sentinel errors of the contract. Callers wrap them with %w and a verb
// phrase; errors.Is tells the classes apart (ngsup maps each to an exit code).
var (
	// ErrBadDir: --dir is missing, relative, or not a folder.
	ErrBadDir = errors.New("bad launch folder")
	// ErrBadID: the launch id is empty, too long, or holds a character that is
	// not allowed (a slash, a space, a control character...).
	ErrBadID = errors.New("bad launch id")
	// ErrNoLaunch: the folder holds no receipt.
	ErrNoLaunch = errors.New("no launch")
	// ErrCorruptReceipt: the receipt is truncated, garbage, or missing a field.
	ErrCorruptReceipt = errors.New("corrupt receipt")
	// ErrUnknownVersion: the receipt was written by a format this build does
	// not read.
	ErrUnknownVersion = errors.New("unknown receipt version")
	// ErrLaunchExists: run was pointed at a folder that already holds a launch.
	ErrLaunchExists = errors.New("launch folder already holds a launch")
)
