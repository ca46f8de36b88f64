package lab

import (
	"reflect"
	"testing"
)

// TestReadGinkgoReport: a spec that ran or skipped itself is a result
// (the skip with its reason); a spec outside the focus, which ginkgo
// reports as skipped without a reason, and a passing suite node are not
// (the lab's first run inside TestCluster counted all 1,001 specs).
func TestReadGinkgoReport(t *testing.T) {
	got, err := readGinkgoReport("testdata/ginkgo-report.json")
	if err != nil {
		t.Fatal(err)
	}
	want := []SpecResult{
		{Name: "[sig-network] LoadBalancers should pass", State: "passed", Seconds: 2},
		{Name: "[sig-network] LoadBalancers should skip itself", State: "skipped", Seconds: 0.001, Message: "LoadBalancer uses 'Proxy' IPMode"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("readGinkgoReport = %+v, want %+v", got, want)
	}
}
