package bridge

import (
	"net/http"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// newMapper is controller-runtime's REST mapper, remembering the mappings
// it found (see knownMappings).
func newMapper(c *rest.Config, httpClient *http.Client) (meta.RESTMapper, error) {
	m, err := apiutil.NewDynamicRESTMapper(c, httpClient)
	if err != nil {
		return nil, err
	}
	return &knownMappings{RESTMapper: m}, nil
}

// knownMappings remembers each REST mapping of one kind and version once
// found. With namespaces configured, the cache asks the mapper for the
// Student's scope on every read (controller-runtime's multi-namespace
// cache), and the mapper walks every API group it knows each time, a
// visible share of the bridge's CPU under load. The kinds the bridge reads (Students,
// Leases, Events) keep their scope while it runs; a kind not found is not
// remembered, so a CRD installed later is still found.
type knownMappings struct {
	meta.RESTMapper
	found sync.Map // mappingKey -> meta.RESTMapping
}

type mappingKey struct {
	gk      schema.GroupKind
	version string
}

func (m *knownMappings) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	if len(versions) != 1 {
		return m.RESTMapper.RESTMapping(gk, versions...)
	}
	key := mappingKey{gk, versions[0]}
	if found, ok := m.found.Load(key); ok {
		mapping := found.(meta.RESTMapping)
		return &mapping, nil
	}
	mapping, err := m.RESTMapper.RESTMapping(gk, versions...)
	if err != nil {
		return nil, err
	}
	m.found.Store(key, *mapping)
	return mapping, nil
}
