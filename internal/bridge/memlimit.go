package bridge

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
)

// SetMemoryLimit sets the Go runtime's soft memory limit to 90% of the
// container's (its cgroup's memory limit), unless GOMEMLIMIT set one: the
// rest is for what the runtime does not count (stacks of the OS, the
// binary) and for the garbage collector to catch up before the container
// would be killed. Without a cgroup limit it sets none. The limit is the
// process's: the command calls it once at its start, not Run, which a
// process may call for several bridges.
func SetMemoryLimit(log logr.Logger) {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		log.Info("Go memory limit from GOMEMLIMIT", "GOMEMLIMIT", v)
		return
	}
	limit, err := cgroupMemoryLimit("/")
	switch {
	case err != nil:
		log.Info("no Go memory limit: the cgroup's memory limit is unreadable", "reason", err.Error())
	case limit > 0:
		soft := limit / 10 * 9
		debug.SetMemoryLimit(soft)
		log.Info("Go memory limit set", "containerLimit", limit, "goMemLimit", soft)
	}
}

// cgroupMemoryLimit is the memory limit in bytes of the process's cgroup
// under root ("/" but in tests), 0 when it has none: memory.max of cgroup
// v2, memory.limit_in_bytes of v1. A container sees its own cgroup as its
// root (a cgroup namespace) or under its path in /proc/self/cgroup.
func cgroupMemoryLimit(root string) (int64, error) {
	self, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0, err
	}
	v2, v1 := "", ""
	sc := bufio.NewScanner(bytes.NewReader(self))
	for sc.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		switch {
		case len(parts) != 3:
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			v1 = parts[2]
		}
	}
	candidates := []string{}
	if v1 != "" {
		candidates = append(candidates, filepath.Join("sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"), "sys/fs/cgroup/memory/memory.limit_in_bytes")
	} else if v2 != "" {
		candidates = append(candidates, filepath.Join("sys/fs/cgroup", v2, "memory.max"), "sys/fs/cgroup/memory.max")
	}
	for _, c := range candidates {
		b, err := os.ReadFile(filepath.Join(root, c))
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", c, err)
		}
		if n >= 1<<62 { // v1's "unlimited" is a page-rounded MaxInt64
			return 0, nil
		}
		return n, nil
	}
	return 0, nil
}
