// Package retry is the module's one retry schedule, on cenkalti/backoff's
// ExponentialBackOff: a first wait doubled at each retry up to a cap. Every
// retry loop takes its waits from here (NextBackOff, Reset once the thing
// retried worked) instead of doubling a duration by hand.
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// New waits exactly first, then twice that, and so on up to most: for a
// singleton's retries (the connector's leader, its producer), where there is
// no crowd to spread and tests pin the schedule.
func New(first, most time.Duration) *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: first, Multiplier: 2, MaxInterval: most}
}

// Jittered has New's nominal waits, each drawn from [d/2, d] (a
// randomization of a third around three quarters of d): members of a group
// retrying after one outage do not come back at once, and no wait is longer
// than its nominal one.
func Jittered(first, most time.Duration) *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: first * 3 / 4, RandomizationFactor: 1.0 / 3, Multiplier: 2, MaxInterval: most * 3 / 4}
}
