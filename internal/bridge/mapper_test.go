package bridge

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// countingMapper counts the mappings asked of it.
type countingMapper struct {
	*meta.DefaultRESTMapper
	asked int
}

func (c *countingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	c.asked++
	return c.DefaultRESTMapper.RESTMapping(gk, versions...)
}

// TestKnownMappingsAsksOnce: a mapping found is asked of the mapper once;
// one not found is asked again, so a CRD installed later is found.
func TestKnownMappingsAsksOnce(t *testing.T) {
	gv := schema.GroupVersion{Group: "example.k8s.io", Version: "v1"}
	student := schema.GroupKind{Group: gv.Group, Kind: "Student"}
	under := &countingMapper{DefaultRESTMapper: meta.NewDefaultRESTMapper([]schema.GroupVersion{gv})}
	m := &knownMappings{RESTMapper: under}

	if _, err := m.RESTMapping(student, "v1"); err == nil {
		t.Fatal("a kind the mapper does not know was mapped")
	}
	under.Add(gv.WithKind("Student"), meta.RESTScopeNamespace)
	for range 3 {
		mapping, err := m.RESTMapping(student, "v1")
		if err != nil {
			t.Fatalf("the kind installed after a failed lookup: %v", err)
		}
		if mapping.Scope.Name() != meta.RESTScopeNameNamespace || mapping.Resource.Resource != "students" {
			t.Fatalf("mapped to %s, scope %s", mapping.Resource, mapping.Scope.Name())
		}
		mapping.Scope = meta.RESTScopeRoot // a caller's change stays its own
	}
	if under.asked != 2 {
		t.Fatalf("the mapper was asked %d times, want 2 (the failed lookup, then once)", under.asked)
	}
}
