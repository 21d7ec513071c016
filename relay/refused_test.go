package relay

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

// TestRefused: Kafka's refusals of the connector's rights or of the
// cluster's policy, wrapped as the offsets package wraps them, stop the
// connector (no retry changes them); a transient error does not.
func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("create the exactly-once offsets topic: %w", kerr.TopicAuthorizationFailed), true},
		{fmt.Errorf("describe: %w", kerr.ClusterAuthorizationFailed), true},
		{fmt.Errorf("create: %w", kerr.PolicyViolation), true},
		{fmt.Errorf("write the read barrier: %w", kerr.NotLeaderForPartition), false},
		{fmt.Errorf("read: %w", kerr.RequestTimedOut), false},
	} {
		if got := refused(tc.err); got != tc.want {
			t.Errorf("refused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
