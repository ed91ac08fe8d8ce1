package execd

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"time"
)

// tailFile follows a command's output file as execd does: every poll it
// reads what was appended since the last complete line and emits one text
// per line with its terminator dropped ("\n" and "\r" both end a line; the
// "\n" of a "\r\n" pair is skipped; a blank line is emitted as "\n"). A
// line still being written is held back until it ends, or until done is
// closed, when whatever is left is read and emitted as it is.
func tailFile(path string, poll time.Duration, emit func(string), done <-chan struct{}) {
	t := time.NewTicker(poll)
	defer t.Stop()
	var pos int64
	for {
		select {
		case <-done:
			readLines(path, pos, emit, true)
			return
		case <-t.C:
			pos = readLines(path, pos, emit, false)
		}
	}
}

// readLines emits the lines of the file from pos and returns where the
// next read starts: after the last line ended, or (final) at the end.
func readLines(path string, pos int64, emit func(string), final bool) int64 {
	f, err := os.Open(path)
	if err != nil {
		return pos
	}
	defer f.Close()
	if _, err := f.Seek(pos, io.SeekStart); err != nil {
		return pos
	}
	r := bufio.NewReader(f)
	var line bytes.Buffer
	cr := false // the previous byte was a "\r" (within this read only, as execd)
	for {
		b, err := r.ReadByte()
		if err != nil {
			break
		}
		pos++
		if b != '\n' && b != '\r' {
			cr = false
			line.WriteByte(b)
			continue
		}
		switch {
		case line.Len() > 0:
			emit(line.String())
			line.Reset()
		case b == '\n' && cr:
			// the second half of "\r\n"
		default:
			emit("\n")
		}
		cr = b == '\r'
	}
	if line.Len() == 0 {
		return pos
	}
	if final {
		emit(line.String())
		return pos
	}
	return pos - int64(line.Len())
}
