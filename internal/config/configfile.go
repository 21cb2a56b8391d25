package config

import (
	"fmt"
	"strings"
	"time"
)

// DocumentedYAML renders the config file that documents every key with its
// default, environment variable and flag: configs/student-bridge.yaml.
func DocumentedYAML() string {
	var b strings.Builder
	b.WriteString(`# student-bridge configuration: every key with its default.
# Precedence: flag > environment (STUDENT_BRIDGE_<KEY>, dots become underscores,
# e.g. nats.urls -> STUDENT_BRIDGE_NATS_URLS) > this file > built-in default.
# Load it with --config configs/student-bridge.yaml.
# Generated from internal/config by 'make generate'; edit Config's tags there.
`)
	var prev []string
	for _, s := range allSettings() {
		parts := strings.Split(s.Key, ".")
		common := 0
		for common < len(prev)-1 && common < len(parts)-1 && prev[common] == parts[common] {
			common++
		}
		if common == 0 {
			b.WriteString("\n")
		}
		for i := common; i < len(parts)-1; i++ {
			fmt.Fprintf(&b, "%s%s:\n", strings.Repeat("  ", i), parts[i])
		}
		indent := strings.Repeat("  ", len(parts)-1)
		flag := "flag --" + s.Flag
		if s.Flag == "" {
			flag = "no flag: environment or file only"
		}
		fmt.Fprintf(&b, "%s# %s\n%s# env %s, %s\n%s%s: %s\n", indent, s.Help, indent, EnvName(s.Key), flag, indent, parts[len(parts)-1], yamlValue(s.Default))
		prev = parts
	}
	return b.String()
}

func yamlValue(v any) string {
	switch d := v.(type) {
	case []string:
		if len(d) == 0 {
			return "[]"
		}
		return "[" + strings.Join(d, ", ") + "]"
	case string:
		if d == "" || strings.ContainsAny(d, "{}:*#") {
			return fmt.Sprintf("%q", d)
		}
		return d
	case time.Duration:
		// 1m rather than 1m0s, as people write it.
		out := d.String()
		if strings.HasSuffix(out, "m0s") {
			out = strings.TrimSuffix(out, "0s")
		}
		if strings.HasSuffix(out, "h0m") {
			out = strings.TrimSuffix(out, "0m")
		}
		return out
	}
	return fmt.Sprint(v)
}
