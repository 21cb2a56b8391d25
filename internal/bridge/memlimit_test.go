package bridge

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCgroupMemoryLimit: the container's limit is read from cgroup v2 and
// v1, in a cgroup namespace (the container's cgroup is the root) and
// without one (under the path /proc/self/cgroup names); no limit is 0.
func TestCgroupMemoryLimit(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"v2 namespaced", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "268435456\n"}, 256 << 20},
		{"v2 by path", map[string]string{"proc/self/cgroup": "0::/kubepods/pod1/c1\n", "sys/fs/cgroup/kubepods/pod1/c1/memory.max": "134217728\n", "sys/fs/cgroup/memory.max": "max\n"}, 128 << 20},
		{"v2 unlimited", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}, 0},
		{"v1", map[string]string{"proc/self/cgroup": "12:cpu,cpuacct:/x\n9:memory:/kubepods/pod1/c1\n0::/\n", "sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes": "536870912\n"}, 512 << 20},
		{"v1 unlimited", map[string]string{"proc/self/cgroup": "9:memory:/\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"no cgroup files", map[string]string{"proc/self/cgroup": "0::/\n"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range c.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := cgroupMemoryLimit(root)
			if err != nil || got != c.want {
				t.Errorf("cgroupMemoryLimit = %d, %v; want %d", got, err, c.want)
			}
		})
	}
	root := t.TempDir()
	if _, err := cgroupMemoryLimit(root); err == nil {
		t.Error("no /proc/self/cgroup: no error")
	}
}
