package config

// Loading: one viper instance per load, defaults from the settings table,
// then the file, the environment and the flags.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Loader reads configuration. Create one per load with New or NewTail.
type Loader struct {
	v        *viper.Viper
	validate func(*Config) error
}

// New returns the bridge's Loader, with every default set and the bridge's
// flags registered on fs (which may be nil).
func New(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).Validate
	l.addFlags(fs, Settings)
	return l
}

// NewTail returns the Loader of `student-bridge tail`: the tail.* flags and
// the NATS connection flags it shares with the bridge.
func NewTail(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).ValidateTail
	l.addFlags(fs, connectionSettings())
	l.addFlags(fs, TailSettings)
	return l
}

// NewSnapshotLoader returns the Loader of `student-bridge snapshot`: the NATS
// connection flags and snapshot.requestSubject.
func NewSnapshotLoader(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).validateConnection
	l.addFlags(fs, connectionSettings())
	l.addFlags(fs, settingsNamed("snapshot.requestSubject"))
	return l
}

// NewHubLoader returns the Loader of `student-bridge hub`: the NATS
// connection flags (to the hub).
func NewHubLoader(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).validateConnection
	l.addFlags(fs, connectionSettings())
	return l
}

// NewServicesLoader returns the Loader of `student-bridge services`: the
// NATS connection flags, the record store and receipts buckets and the
// expected services.
func NewServicesLoader(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).validateConnection
	l.addFlags(fs, connectionSettings())
	l.addFlags(fs, settingsNamed("state.bucket", "receipts.bucket", "services.expected"))
	return l
}

// NewVerifyLoader returns the Loader of `student-bridge verify`: the NATS
// connection flags, where the Kubernetes API is, which Students the bridge
// watches, its cluster name and its record store.
func NewVerifyLoader(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).validateVerify
	l.addFlags(fs, connectionSettings())
	l.addFlags(fs, settingsNamed("kubeconfig", "master", "cluster", "namespaces", "labelSelector", "state.bucket"))
	return l
}

// NewReleaseLoader returns the Loader of `student-bridge release-finalizers`:
// where the Kubernetes API is, which Students the bridge watched and its
// leader election Lease.
func NewReleaseLoader(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).validateRelease
	for _, s := range Settings {
		switch {
		case s.Key == "kubeconfig", s.Key == "master", s.Key == "namespaces", s.Key == "labelSelector", s.Key == "shards.count",
			strings.HasPrefix(s.Key, "leaderElection."):
			l.addFlags(fs, []Setting{s})
		}
	}
	return l
}

// settingsNamed returns the settings of keys, in the table's order.
func settingsNamed(keys ...string) []Setting {
	var out []Setting
	for _, s := range Settings {
		if slices.Contains(keys, s.Key) {
			out = append(out, s)
		}
	}
	return out
}

func connectionSettings() []Setting {
	var shared []Setting
	for _, s := range Settings {
		for _, k := range natsConnectionKeys {
			if s.Key == k || (strings.HasSuffix(k, ".") && strings.HasPrefix(s.Key, k)) {
				shared = append(shared, s)
			}
		}
	}
	return shared
}

func newLoader() *Loader {
	v := viper.New()
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	for _, s := range allSettings() {
		v.SetDefault(s.Key, s.Default)
		// AutomaticEnv only answers keys viper is asked for; binding makes
		// Unmarshal see environment variables of nested keys too.
		_ = v.BindEnv(s.Key, EnvName(s.Key))
	}
	return &Loader{v: v}
}

func allSettings() []Setting {
	return append(append([]Setting(nil), Settings...), TailSettings...)
}

func (l *Loader) addFlags(fs *pflag.FlagSet, settings []Setting) {
	if fs == nil {
		return
	}
	for _, s := range settings {
		if s.Flag == "" {
			continue
		}
		short := ""
		if s.Flag == "output" {
			short = "o"
		}
		switch d := s.Default.(type) {
		case bool:
			fs.BoolP(s.Flag, short, d, s.Help)
		case int:
			fs.IntP(s.Flag, short, d, s.Help)
		case int64:
			fs.Int64P(s.Flag, short, d, s.Help)
		case uint64:
			fs.Uint64P(s.Flag, short, d, s.Help)
		case float32:
			fs.Float32P(s.Flag, short, d, s.Help)
		case float64:
			fs.Float64P(s.Flag, short, d, s.Help)
		case time.Duration:
			fs.DurationP(s.Flag, short, d, s.Help)
		case []string:
			fs.StringSliceP(s.Flag, short, d, s.Help)
		default:
			fs.StringP(s.Flag, short, fmt.Sprint(d), s.Help)
		}
		_ = l.v.BindPFlag(s.Key, fs.Lookup(s.Flag))
	}
}

// EnvName is the environment variable of key.
func EnvName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// Load reads file (if not empty), then the environment and the flags, and
// returns the validated configuration.
func (l *Loader) Load(file string) (*Config, error) {
	if file != "" {
		l.v.SetConfigFile(file)
		l.v.SetConfigType("yaml")
		if err := l.v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
		if err := checkKnownKeys(l.v.AllKeys()); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
	}
	var c Config
	var md mapstructure.Metadata
	err := l.v.Unmarshal(&c, func(dc *mapstructure.DecoderConfig) {
		dc.Metadata = &md
		dc.ErrorUnused = false
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		)
	})
	if err != nil {
		return nil, fmt.Errorf("config: %w", explainDecodeError(err))
	}
	c.Namespaces = trimAll(c.Namespaces)
	c.Tail.Subjects = trimAll(c.Tail.Subjects)
	c.Services.Expected = trimAll(c.Services.Expected)
	if err := l.validate(&c); err != nil {
		return nil, err
	}
	return &c, nil
}

func checkKnownKeys(keys []string) error {
	known := map[string]bool{}
	for _, s := range allSettings() {
		known[strings.ToLower(s.Key)] = true
	}
	var unknown []string
	for _, k := range keys {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("unknown key(s) %s", strings.Join(unknown, ", "))
	}
	return nil
}

// explainDecodeError keeps mapstructure's message, which names the key, but
// drops its "decoding failed due to the following error(s)" preamble.
func explainDecodeError(err error) error {
	var de *mapstructure.DecodeError
	if errors.As(err, &de) {
		return fmt.Errorf("key %s: %w", de.Name(), de.Unwrap())
	}
	return err
}

func trimAll(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
