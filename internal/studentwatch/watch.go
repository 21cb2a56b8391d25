// Package studentwatch lists and watches Students for the bridge's cache
// through a REST client that decodes with watchjson's serializer: the
// Students' informer, and nothing else, skips apimachinery's two extra
// passes over each watch event.
package studentwatch

import (
	"context"
	"fmt"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/watchjson"
)

// NewCache returns a cache.NewCacheFunc for a manager whose cache holds
// the Students of namespace ("" for all) that selector (nil for all)
// selects: controller-runtime's cache, with the Students' informer
// listing and watching through watchjson's decoders. Every other
// kind's informer is controller-runtime's own.
//
// The cache must be given that namespace and selector for Students too
// (cache.Options): they decide what its readers see, this only what the
// informer asks the API server for. A cache over several namespaces makes
// one informer per namespace, and which one a call to NewInformer is for
// is not known: give it controller-runtime's NewCache instead.
func NewCache(namespace string, selector labels.Selector) cache.NewCacheFunc {
	return func(cfg *rest.Config, opts cache.Options) (cache.Cache, error) {
		hc := opts.HTTPClient
		if hc == nil {
			var err error
			if hc, err = rest.HTTPClientFor(cfg); err != nil {
				return nil, err
			}
		}
		c, err := NewClient(cfg, hc, opts.Scheme)
		if err != nil {
			return nil, err
		}
		lw := ListWatch(c, namespace, selector)
		opts.NewInformer = func(other toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
			if _, ok := obj.(*studentv1.Student); ok {
				other = lw
			}
			return toolscache.NewSharedIndexInformer(other, obj, resync, indexers)
		}
		return cache.New(cfg, opts)
	}
}

// NewClient is a REST client for Students (example.k8s.io/v1) over hc,
// speaking JSON, the only encoding the API server serves custom resources
// in, with watchjson's decoders. s must hold Students and metav1's
// types.
func NewClient(cfg *rest.Config, hc *http.Client, s *runtime.Scheme) (*rest.RESTClient, error) {
	if s == nil {
		return nil, fmt.Errorf("studentwatch: no scheme")
	}
	cfg = rest.CopyConfig(cfg)
	gv := studentv1.GroupVersion
	cfg.GroupVersion = &gv
	cfg.APIPath = "/apis"
	cfg.ContentType = runtime.ContentTypeJSON
	cfg.AcceptContentTypes = runtime.ContentTypeJSON
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	ns, err := watchjson.NewSerializer(s)
	if err != nil {
		return nil, err
	}
	cfg.NegotiatedSerializer = ns
	return rest.RESTClientForConfigAndClient(cfg, hc)
}

// ListWatch lists and watches the Students of namespace ("" for all) that
// selector (nil for all) selects through c, with the requests
// controller-runtime's cache makes: watches ask for bookmarks.
func ListWatch(c rest.Interface, namespace string, selector labels.Selector) *toolscache.ListWatch {
	request := func(opts *metav1.ListOptions) *rest.Request {
		if selector != nil && !selector.Empty() {
			opts.LabelSelector = selector.String()
		}
		return c.Get().NamespaceIfScoped(namespace, namespace != "").Resource("students").
			VersionedParams(opts, metav1.ParameterCodec)
	}
	return &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list := &studentv1.StudentList{}
			if err := request(&opts).Do(ctx).Into(list); err != nil {
				return nil, err
			}
			return list, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.Watch = true
			opts.AllowWatchBookmarks = true
			return request(&opts).Watch(ctx)
		},
	}
}
