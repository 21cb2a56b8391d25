package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/student-bridge/student-bridge/internal/config"
)

// FuzzLoad: any file either loads into a configuration that validates, or
// fails with an error that says where (the file or a key); never a panic.
func FuzzLoad(f *testing.F) {
	f.Add("workers: 2\n")
	f.Add("nats:\n  urls: nats://a:4222\n  stream:\n    replicas: 3\n")
	f.Add("nats:\n  mode: kafka\n")
	f.Add("retry:\n  maxDelay: -1s\n")
	f.Add("tail:\n  deliver: since\n  since: 1h\n")
	f.Add("[]")
	f.Add("workers: [\n")
	f.Add(": : :")
	f.Add("namespaces: a,b\nlabelSelector: app in (x)\n")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, content string) {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, l := range []*config.Loader{config.NewLoader(nil, config.BridgeCommand), config.NewLoader(nil, config.TailCommand)} {
			cfg, err := l.Load(p)
			if err != nil {
				if !strings.Contains(err.Error(), "config") {
					t.Fatalf("error does not say it is about configuration: %v", err)
				}
				continue
			}
			if cfg == nil {
				t.Fatal("nil config without error")
			}
		}
	})
}
