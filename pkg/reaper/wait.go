package reaper

import (
	"time"

	"github.com/ngharness/ngharness/pkg/proto"
)

// waitPoll is how often wait looks at the receipt.
const waitPoll = 25 * time.Millisecond

// Wait blocks until the launch in dir has ended or timeout passed (0: no
// limit) and returns its receipt with exit code 0 (ended) or 3 (still
// running). A launch whose supervisor died without recording the end, and
// whose harness is gone too, is reported ended with ExitCode -1 and an Error
// saying so (the receipt on disk is left as it is).
func Wait(dir string, timeout time.Duration) (*proto.Receipt, int, error) {
	l, err := OpenLaunch(dir, false)
	if err != nil {
		return nil, proto.ExitUsage, err
	}
	if l.Receipt == nil {
		return nil, proto.ExitUsage, proto.ErrNoLaunch
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for i := 0; ; i++ {
		if l.Receipt.Ended {
			return l.Receipt, proto.ExitOK, nil
		}
		if i%10 == 0 && !l.FS.Live(l.supervisor()) {
			if err := l.Reload(); err != nil {
				return nil, proto.ExitUsage, err
			}
			if l.Receipt.Ended {
				continue
			}
			if h := l.harness(); h.PID == 0 || !l.FS.Live(h) {
				r := *l.Receipt
				r.Ended = true
				r.ExitCode = -1
				r.Error = "the supervisor exited without recording the harness's end"
				return &r, proto.ExitOK, nil
			}
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			return l.Receipt, proto.ExitStillRunning, nil
		}
		time.Sleep(waitPoll)
		if err := l.Reload(); err != nil {
			return nil, proto.ExitUsage, err
		}
	}
}

// Status returns the launch's receipt.
func Status(dir string) (*proto.Receipt, error) {
	dir, err := proto.ValidateDir(dir)
	if err != nil {
		return nil, err
	}
	return proto.ReadReceipt(dir)
}
