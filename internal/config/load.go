package config

// Loading: one viper instance per load, defaults from the settings table,
// then the file, the environment and the flags of the command.

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

// Loader reads configuration. Create one per load with NewLoader.
type Loader struct {
	v        *viper.Viper
	validate func(*Config) error
}

// A Command is what one command reads: its keys (a key, or a prefix ending
// in '.') get flags, and Validate checks them. The other keys keep their
// defaults unless the file or the environment sets them.
type Command struct {
	Keys     []string
	Validate func(*Config) error
}

// natsConnection are the keys of every command that connects to NATS.
var natsConnection = []string{"nats.urls", "nats.name", "nats.connectTimeout", "nats.reconnectWait", "nats.maxReconnects",
	"nats.subjectPrefix", "nats.stream.name", "nats.auth.", "nats.tls."}

// The commands of student-bridge.
var (
	// BridgeCommand reads every key but tail's.
	BridgeCommand = Command{Keys: keysOf(Settings), Validate: (*Config).Validate}
	// TailCommand: the NATS connection and tail.*.
	TailCommand = Command{Keys: append(slices.Clone(natsConnection), "tail."), Validate: (*Config).ValidateTail}
	// SnapshotCommand: the NATS connection and where snapshot requests go.
	SnapshotCommand = Command{Keys: append(slices.Clone(natsConnection), "snapshot.requestSubject"), Validate: (*Config).validateConnection}
	// HubCommand: the NATS connection (to the hub).
	HubCommand = Command{Keys: natsConnection, Validate: (*Config).validateConnection}
	// ServicesCommand: the NATS connection, the record store and receipts buckets
	// and the expected services.
	ServicesCommand = Command{Keys: append(slices.Clone(natsConnection), "records.bucket", "receipts.bucket", "services.expected"), Validate: (*Config).validateConnection}
	// VerifyCommand: the NATS connection, where the Kubernetes API is, which
	// Students the bridge watches, its cluster name and its record store.
	VerifyCommand = Command{Keys: append(slices.Clone(natsConnection), "kubeconfig", "master", "cluster", "namespaces", "labelSelector", "records.bucket"), Validate: (*Config).validateVerify}
	// ReleaseCommand (release-finalizers): where the Kubernetes API is, which
	// Students the bridge watched and its leader election or shard Leases.
	ReleaseCommand = Command{Keys: []string{"kubeconfig", "master", "namespaces", "labelSelector", "shards.count", "leaderElection."}, Validate: (*Config).validateRelease}
)

// NewLoader returns a Loader for cmd, with every default set and cmd's
// flags registered on fs (which may be nil), in the table's order.
func NewLoader(fs *pflag.FlagSet, cmd Command) *Loader {
	l := newLoader()
	l.validate = cmd.Validate
	var own []Setting
	for _, s := range allSettings() {
		if slices.ContainsFunc(cmd.Keys, func(k string) bool { return s.Key == k || strings.HasSuffix(k, ".") && strings.HasPrefix(s.Key, k) }) {
			own = append(own, s)
		}
	}
	l.addFlags(fs, own)
	return l
}

func keysOf(settings []Setting) []string {
	keys := make([]string, len(settings))
	for i, s := range settings {
		keys[i] = s.Key
	}
	return keys
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

func (l *Loader) addFlags(fs *pflag.FlagSet, settings []Setting) {
	if fs == nil {
		return
	}
	for _, s := range settings {
		if s.Flag == "" {
			continue
		}
		short := s.Short
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
	err := l.v.Unmarshal(&c, func(dc *mapstructure.DecoderConfig) {
		dc.TagName = "key"
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
