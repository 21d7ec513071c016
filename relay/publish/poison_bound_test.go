package publish

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

// TestPoisonKeepsSuspects: a refused batch of more records than the bound
// keeps every suspect (the guilty one among them would otherwise be
// forgotten, produced in a batch again and refused again, forever); past
// the bound, convicting forgets the guilty, never a suspect.
func TestPoisonKeepsSuspects(t *testing.T) {
	var ps Poison
	n := maxPoison + maxPoison/2
	for i := 0; i < n; i++ {
		ps.suspect(fmt.Sprint("s", i), kerr.InvalidTimestamp)
	}
	for _, i := range []int{0, maxPoison - 1, maxPoison, n - 1} {
		if _, ok := ps.m[fmt.Sprint("s", i)]; !ok {
			t.Errorf("suspect %d of %d forgotten", i, n)
		}
	}

	var qs Poison
	for i := 0; i < maxPoison-10; i++ {
		qs.convict(fmt.Sprint("g", i), kerr.InvalidTimestamp)
	}
	for i := 0; i < 20; i++ {
		qs.suspect(fmt.Sprint("s", i), kerr.InvalidTimestamp)
	}
	qs.convict("g-last", kerr.InvalidRecord)
	for i := 0; i < 20; i++ {
		if v, ok := qs.m[fmt.Sprint("s", i)]; !ok || v.guilty {
			t.Errorf("suspect %d: %+v, %v after the guilty filled the bound", i, v, ok)
		}
	}
	if v, ok := qs.m["g-last"]; !ok || !v.guilty {
		t.Errorf("the last convicted record is not remembered: %+v %v", v, ok)
	}
	if len(qs.m) > maxPoison {
		t.Errorf("%d entries, more than the bound %d with only 20 suspects", len(qs.m), maxPoison)
	}
	if got := qs.n.Load(); got != int64(len(qs.m)) {
		t.Errorf("n = %d, len = %d", got, len(qs.m))
	}
}

// TestRefusedAlone: a record produced alone and refused for its data is
// convicted at once; refused with an error that a passing fault gives too,
// only the maxAloneRefusals-th time.
func TestRefusedAlone(t *testing.T) {
	for _, err := range []error{kerr.InvalidTimestamp, kerr.InvalidRecord, kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.PolicyViolation, kerr.InvalidTopicException} {
		var ps Poison
		ps.suspect("k", err)
		if !ps.refusedAlone("k", err) {
			t.Errorf("%v: not convicted at the first refusal alone", err)
		}
	}
	for _, err := range []error{kerr.UnknownServerError, kerr.CorruptMessage, fmt.Errorf("something franz-go says")} {
		var ps Poison
		ps.suspect("k", err)
		for i := 1; i < maxAloneRefusals; i++ {
			if ps.refusedAlone("k", err) {
				t.Fatalf("%v: convicted at refusal %d alone", err, i)
			}
			if v := ps.m["k"]; v.guilty || v.alone != i {
				t.Fatalf("%v: after %d refusals alone %+v", err, i, v)
			}
		}
		if !ps.refusedAlone("k", err) {
			t.Errorf("%v: not convicted at the %d-th refusal alone: the line would wedge", err, maxAloneRefusals)
		}
	}
}
