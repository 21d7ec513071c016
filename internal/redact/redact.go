// Package redact takes a secret out of an error's text without taking the
// error's type away: a caller still finds a *pgconn.PgError (its SQLSTATE
// decides retry or stop) with errors.As, while every text printed, logged
// or put in a message reads the masked one.
package redact

// Error is an error whose text is masked. Unwrap gives the error itself,
// whose own text may hold the secret: print the Error, not what errors.As
// finds in it, or mask that too.
type Error struct {
	text string
	err  error
}

// Wrap returns err with its text passed through mask, or nil for nil.
func Wrap(err error, mask func(string) string) error {
	if err == nil {
		return nil
	}
	return &Error{text: mask(err.Error()), err: err}
}

func (e *Error) Error() string { return e.text }
func (e *Error) Unwrap() error { return e.err }
