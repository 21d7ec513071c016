package partition

// SetVerifiedMajors replaces the majors on which the move is trusted, for a
// test of the refusal on another one; the returned func restores them.
func SetVerifiedMajors(low, high int) (restore func()) {
	old := verifiedMajors
	verifiedMajors = [2]int{low, high}
	return func() { verifiedMajors = old }
}
