package testenv

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections on a loopback port to a target address, and
// can be taken down (every connection closed, new ones refused) and brought
// up again on the same port: a server that goes away and comes back, as its
// clients see it, without restarting the server. It can also be frozen: a
// path that goes silent (a dropped NAT entry, a firewall that drops
// everything), where nothing is closed or reset and no byte goes through.
type Proxy struct {
	Addr   string // host:port to connect to instead of the target
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
	// thawed is closed while bytes flow; Freeze replaces it with an open
	// one, which Thaw (or Down) closes.
	thawed chan struct{}
}

// StartProxy starts a proxy to target (host:port), closed when the test
// ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}, thawed: make(chan struct{})}
	close(p.thawed)
	p.serve(ln)
	t.Cleanup(func() { p.Down(); p.wg.Wait() })
	return p
}

// Down closes the listener and every connection: connecting is refused
// until Up. It ends a freeze.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	p.thawLocked()
}

// Freeze stops forwarding bytes, both ways, on every connection, open or
// accepted meanwhile, closing none: each side's writes land in its kernel's
// buffers and its reads wait, as on a path that drops everything, until
// Thaw. A connection made meanwhile is accepted (a real path would let no
// SYN through) and hangs before its first byte.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
		p.thawed = make(chan struct{})
	default:
	}
}

// Thaw forwards again what waited and what follows.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.thawLocked()
}

func (p *Proxy) thawLocked() {
	select {
	case <-p.thawed:
	default:
		close(p.thawed)
	}
}

// waitThawed returns once bytes may flow.
func (p *Proxy) waitThawed() {
	p.mu.Lock()
	ch := p.thawed
	p.mu.Unlock()
	<-ch
}

// Up listens on the proxy's port again.
func (p *Proxy) Up(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("tcp", p.Addr)
	if err != nil {
		t.Fatalf("proxy: listen on %s again: %v", p.Addr, err)
	}
	p.serve(ln)
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.forward(ln, c)
			}()
		}
	}()
}

// forward copies both ways between c and a new connection to the target,
// unless the proxy went down (or another listener took over) meanwhile.
func (p *Proxy) forward(ln net.Listener, c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.ln != ln {
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			// Not read while frozen: the sender's bytes stay in the
			// kernels' buffers, unacknowledged once those are full.
			p.waitThawed()
			n, err := src.Read(buf)
			if n > 0 {
				// Read as the freeze began: held until Thaw.
				p.waitThawed()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}
