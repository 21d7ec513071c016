package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
)

// TestIsReset: a reset or a closed connection from a server that answered
// is tried again (it may hide the TLS alert refusing the client
// certificate); a refused or unreachable server is not.
func TestIsReset(t *testing.T) {
	op := func(err error) error {
		return fmt.Errorf("failed to write startup message: %w", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", err)})
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{op(syscall.ECONNRESET), true},
		{op(syscall.EPIPE), true},
		{fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), true},
		{op(syscall.ECONNREFUSED), false},
		{&net.OpError{Op: "remote error", Err: errors.New("tls: expired certificate")}, false},
		{errors.New("timeout"), false},
	} {
		if got := isReset(c.err); got != c.want {
			t.Errorf("isReset(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
