package harnesstest

import (
	"bufio"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
)

// RxQueued sums the bytes waiting unread in the receive queues of the TCP
// sockets connected to port on 127.0.0.1 (the clients of the fake model):
// a reply the server wrote that the harness has not read yet.
func RxQueued(port int) (int, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	total := 0
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		rem := fields[2]
		i := strings.IndexByte(rem, ':')
		if i < 0 {
			continue
		}
		p, err := strconv.ParseUint(rem[i+1:], 16, 16)
		if err != nil || int(p) != port {
			continue
		}
		q := fields[4]
		j := strings.IndexByte(q, ':')
		if j < 0 {
			continue
		}
		rx, err := strconv.ParseUint(q[j+1:], 16, 32)
		if err != nil {
			continue
		}
		total += int(rx)
	}
	return total, sc.Err()
}

// ModelPort is the fake model's port.
func (w *World) ModelPort() int {
	w.T.Helper()
	u, err := url.Parse(w.Model.URL())
	if err != nil {
		w.T.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		w.T.Fatal(err)
	}
	return p
}

// PausedLook opens checkpoint id on p and the owner (every run parks, its
// launch paused), takes one look at the launch (Observe), reads the bytes
// queued unread for the harness from the fake model on port (RxQueued),
// and commits the checkpoint. It returns the look and the bytes queued.
func (w *World) PausedLook(p *driver.Participant, id, sandboxID, launchID string, port int) (Still, int) {
	w.T.Helper()
	w.Prepare(p, id)
	a := w.Observe(sandboxID, launchID)
	base, err := RxQueued(port)
	if err != nil {
		w.T.Fatal(err)
	}
	w.Commit(p, id)
	return a, base
}

// ReleaseSettled releases the fake model's held reply and waits until the
// bytes queued unread for the harness on port grow past base and then stay
// the same for half a second (the reply streams in pieces). It returns the
// bytes queued then.
func (w *World) ReleaseSettled(port, base int) int {
	w.T.Helper()
	w.Model.Release()
	queued, since := base, time.Now()
	testkit.Eventually(w.T, fmt.Sprintf("the released reply in %s's socket", w.harness), func() (bool, string) {
		q, err := RxQueued(port)
		if err != nil {
			return false, err.Error()
		}
		if q != queued {
			queued, since = q, time.Now()
		}
		return queued > base && time.Since(since) > 500*time.Millisecond, fmt.Sprintf("%d bytes queued (%d before the release)", q, base)
	})
	return queued
}
