package execd

import (
	"net"
	"sync"
)

// port is execd's port as a client of the real server meets it through
// docker-proxy. Its accept loop hands connections to the http.Server on
// it, or, while dropping, accepts each and closes it at once (half of
// them with a reset, SO_LINGER 0): never refused and never answered. A
// client sees that before execd listens (the create-then-listen window)
// and after the container is killed but not yet removed (the Failed
// window of a delete). The http.Server serves a listener of its own
// (next), so closing the server leaves the port accepting and dropping
// until close.
type port struct {
	ln net.Listener

	mu      sync.Mutex
	drop    bool
	dropped int
	next    *connQueue
}

// newPort starts accepting on ln; drop says whether it drops until told
// otherwise.
func newPort(ln net.Listener, drop bool) *port {
	p := &port{ln: ln, drop: drop, next: newConnQueue(ln.Addr())}
	go p.loop()
	return p
}

func (p *port) loop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.next.Close()
			return
		}
		p.mu.Lock()
		drop, n := p.drop, p.dropped
		if drop {
			p.dropped++
		}
		p.mu.Unlock()
		if drop || !p.next.put(c) {
			if tc, ok := c.(*net.TCPConn); ok && n%2 == 1 {
				_ = tc.SetLinger(0) // a reset rather than an end of file
			}
			c.Close()
		}
	}
}

// listener is what the http.Server on the port serves.
func (p *port) listener() net.Listener { return p.next }

// setDrop starts or stops dropping every connection.
func (p *port) setDrop(drop bool) {
	p.mu.Lock()
	p.drop = drop
	p.mu.Unlock()
}

// droppedCount is how many connections were dropped.
func (p *port) droppedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// close closes the port: connections are refused from now on.
func (p *port) close() { _ = p.ln.Close() }

// connQueue is a net.Listener fed by a port's accept loop.
type connQueue struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

// put hands c to the server; false once the server stopped accepting.
func (q *connQueue) put(c net.Conn) bool {
	select {
	case q.ch <- c:
		return true
	case <-q.done:
		return false
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }
