package reaper

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// siginfoPID extracts si_pid from a siginfo filled by waitid. On 64-bit Linux
// (amd64 and arm64 alike) the union holding si_pid starts at byte 16, after
// si_signo, si_errno, si_code and padding.
func siginfoPID(info *unix.Siginfo) int {
	words := (*[5]int32)(unsafe.Pointer(info))
	return int(words[4])
}
