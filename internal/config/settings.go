package config

// The settings table, read from Config's tags: every key once, with its
// flag, default, choices and help.

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Setting is one configuration key as Config's tags declare it.
type Setting struct {
	Key     string
	Flag    string // empty for keys that must not be flags, like secrets
	Short   string // a one-letter flag beside Flag, or empty
	Default any    // the field's type: string, bool, int, int64, uint64, float32, float64, time.Duration or []string
	Choices []string
	Help    string
}

// all is every key, in Config's field order: the bridge's, then tail's
// (Tail is Config's last field). Read from the tags once.
var all = table(reflect.TypeFor[Config](), "")

// Settings lists the bridge's keys, in Config's field order.
var Settings = slices.DeleteFunc(slices.Clone(all), isTail)

// TailSettings lists the keys of `student-bridge tail` (under tail: in the
// same file).
var TailSettings = slices.DeleteFunc(slices.Clone(all), func(s Setting) bool { return !isTail(s) })

// table reads the settings of struct type t, whose keys start with prefix.
// A bad tag is a programming error: it panics when the package loads.
func table(t reflect.Type, prefix string) []Setting {
	var out []Setting
	for f := range t.Fields() {
		key, ok := f.Tag.Lookup("key")
		if !ok {
			panic(fmt.Sprintf("config: field %s.%s has no key tag", t.Name(), f.Name))
		}
		key = prefix + key
		if f.Type.Kind() == reflect.Struct {
			out = append(out, table(f.Type, key+".")...)
			continue
		}
		s := Setting{Key: key, Flag: f.Tag.Get("flag"), Short: f.Tag.Get("short"), Help: f.Tag.Get("help")}
		if c := f.Tag.Get("choices"); c != "" {
			s.Choices = strings.Split(c, "|")
		}
		d, err := parseDefault(f.Type, f.Tag.Get("default"))
		if err != nil || s.Help == "" {
			panic(fmt.Sprintf("config: key %s: default %q: %v (help %q)", key, f.Tag.Get("default"), err, s.Help))
		}
		s.Default = d
		out = append(out, s)
	}
	return out
}

// parseDefault reads a default tag as a value of type t; empty is t's zero
// value (an empty list for a list).
func parseDefault(t reflect.Type, tag string) (any, error) {
	if t == reflect.TypeFor[time.Duration]() {
		if tag == "" {
			return time.Duration(0), nil
		}
		return time.ParseDuration(tag)
	}
	if tag == "" {
		if t.Kind() == reflect.Slice {
			return []string{}, nil
		}
		return reflect.Zero(t).Interface(), nil
	}
	switch t.Kind() {
	case reflect.String:
		return tag, nil
	case reflect.Bool:
		return strconv.ParseBool(tag)
	case reflect.Int:
		return strconv.Atoi(tag)
	case reflect.Int64:
		return strconv.ParseInt(tag, 10, 64)
	case reflect.Uint64:
		return strconv.ParseUint(tag, 10, 64)
	case reflect.Float32:
		v, err := strconv.ParseFloat(tag, 32)
		return float32(v), err
	case reflect.Float64:
		return strconv.ParseFloat(tag, 64)
	case reflect.Slice:
		return strings.Split(tag, ","), nil
	}
	return nil, fmt.Errorf("no default for a field of type %s", t)
}

func isTail(s Setting) bool { return strings.HasPrefix(s.Key, "tail.") }

// Lookup returns the setting of key.
func Lookup(key string) (Setting, bool) {
	for _, s := range allSettings() {
		if s.Key == key {
			return s, true
		}
	}
	return Setting{}, false
}

// allSettings is every key, the bridge's then tail's; callers only read it.
func allSettings() []Setting { return all }
