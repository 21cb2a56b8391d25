package bridge_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/student-bridge/student-bridge/internal/bridgetest"
)

// TestWatchUncompressedUnlessAsked: by default the bridge's watch of the
// Students arrives as the API server wrote it; with kubeAPICompression the
// server gzips it (which is how the test knows it can tell the two apart).
func TestWatchUncompressedUnlessAsked(t *testing.T) {
	for prefix, compression := range map[string]bool{"plain": false, "gzip": true} {
		ns := newNamespace(t)
		cfg := testConfig(t, ns, prefix)
		cfg.KubeAPICompression = compression
		var watches watchLog
		restCfg := rest.CopyConfig(st.RestConfig)
		restCfg.Wrap(watches.wrap)
		stop := bridgetest.Run(t, cfg, restCfg)
		if err := st.Client.Create(context.Background(), newStudent(ns, "a", "wang", "china")); err != nil {
			t.Fatal(err)
		}
		waitStream(t, natsConn(t), cfg.NATS.Stream.Name, 1)
		stop()
		watched, gzipped := watches.counts()
		switch {
		case watched == 0:
			t.Errorf("kubeAPICompression %v: no watch of the Students went through the bridge's client", compression)
		case !compression && gzipped > 0:
			t.Errorf("kubeAPICompression false: %d of %d watches of the Students arrived gzipped", gzipped, watched)
		case compression && gzipped == 0:
			t.Errorf("kubeAPICompression true: none of %d watches of the Students arrived gzipped", watched)
		}
	}
}

// watchLog counts the watches of Students a client made, and how many of
// their responses came gzipped (inflated by Go's transport on the way).
type watchLog struct {
	mu               sync.Mutex
	watched, gzipped int
}

func (l *watchLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil && strings.HasSuffix(req.URL.Path, "/students") && req.URL.Query().Get("watch") == "true" {
			l.mu.Lock()
			l.watched++
			if resp.Uncompressed || resp.Header.Get("Content-Encoding") == "gzip" {
				l.gzipped++
			}
			l.mu.Unlock()
		}
		return resp, err
	})
}

func (l *watchLog) counts() (watched, gzipped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.watched, l.gzipped
}
