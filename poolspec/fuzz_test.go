package poolspec_test

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

// FuzzAdmit decodes the fuzzer's bytes into a pool set (the generator of
// TestCCMAndSpeakerAgree, reading its choices from the bytes) and checks
// it as the property test does: no panic, a deterministic admission that
// does not depend on the order of the list, refusals that name a spec
// field, admitted pools that do not overlap, and the CCM and the speaker
// agreeing on the owner of every probed address. The seeds run in every
// go test; make fuzz explores further.
func FuzzAdmit(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{7, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	for seed := range uint64(16) {
		r := rand.New(rand.NewPCG(seed, 0xf022))
		b := make([]byte, 64+r.IntN(512))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g := gen{&byteSource{data}}
		pools := g.poolSet()
		probes := g.probes(pools)
		before := deepCopies(pools)
		checkAgreement(t, g, pools, probes)
		for i, p := range pools {
			if !reflect.DeepEqual(p, before[i]) {
				t.Fatalf("pool %s was modified", p.Name)
			}
		}
	})
}

func deepCopies(pools []*v1alpha1.IPPool) []*v1alpha1.IPPool {
	out := make([]*v1alpha1.IPPool, len(pools))
	for i, p := range pools {
		out[i] = p.DeepCopy()
	}
	return out
}
