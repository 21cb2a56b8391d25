package natssink

import (
	"fmt"
	"strings"

	cloudevents "github.com/cloudevents/sdk-go/v2"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// DefaultSubjectLayout publishes student.created, student.updated,
// student.deleted and student.snapshot, so "student.*" receives everything.
const DefaultSubjectLayout = "{prefix}.{op}"

// SubjectLayout maps a CloudEvent to the NATS subject it is published on.
// Tokens:
//
//	{prefix}    the configured prefix, e.g. "student"
//	{op}        the last dot-separated part of the event type: created, updated, deleted, snapshot
//	{namespace} the Student's namespace (first half of the CloudEvent subject "namespace/name")
//	{name}      the Student's name (second half)
//
// Dots in a namespace or name become underscores, so each stays one subject
// token. A layout must start with "{prefix}." so that the stream subject
// "<prefix>.>" covers every event.
type SubjectLayout struct {
	prefix string
	layout string
}

// NewSubjectLayout validates layout and prefix.
func NewSubjectLayout(prefix, layout string) (SubjectLayout, error) {
	if prefix == "" || strings.ContainsAny(prefix, " \t\r\n*>") || strings.HasPrefix(prefix, ".") || strings.HasSuffix(prefix, ".") || strings.Contains(prefix, "..") {
		return SubjectLayout{}, fmt.Errorf("prefix %q is not a valid NATS subject prefix", prefix)
	}
	if !strings.HasPrefix(layout, "{prefix}.") {
		return SubjectLayout{}, fmt.Errorf("layout %q must start with \"{prefix}.\"", layout)
	}
	if !strings.Contains(layout, "{op}") {
		return SubjectLayout{}, fmt.Errorf("layout %q must contain {op}, or consumers cannot tell events apart", layout)
	}
	rest := layout
	for _, tok := range []string{"{prefix}", "{op}", "{namespace}", "{name}"} {
		rest = strings.ReplaceAll(rest, tok, "x")
	}
	if strings.ContainsAny(rest, "{} \t*>") {
		return SubjectLayout{}, fmt.Errorf("layout %q has an unknown token or a wildcard; known tokens are {prefix} {op} {namespace} {name}", layout)
	}
	return SubjectLayout{prefix: prefix, layout: layout}, nil
}

// Prefix is the subject prefix; the stream captures "<prefix>.>".
func (l SubjectLayout) Prefix() string { return l.prefix }

// StreamSubject is the wildcard subject that covers every event of the layout.
func (l SubjectLayout) StreamSubject() string { return l.prefix + ".>" }

// Subject returns the NATS subject for event. It runs once per event, so
// it writes the layout's parts in one pass rather than building a
// strings.Replacer each time.
func (l SubjectLayout) Subject(event cloudevents.Event) string {
	namespace, name, _ := strings.Cut(event.Subject(), "/")
	var b strings.Builder
	b.Grow(len(l.layout) + len(l.prefix) + len(namespace) + len(name))
	rest := l.layout
	for {
		open := strings.IndexByte(rest, '{')
		end := strings.IndexByte(rest, '}')
		if open < 0 || end < open { // NewSubjectLayout allows no other braces
			b.WriteString(rest)
			return b.String()
		}
		b.WriteString(rest[:open])
		switch rest[open : end+1] {
		case "{prefix}":
			b.WriteString(l.prefix)
		case "{op}":
			b.WriteString(token(studentv1.Operation(event.Type())))
		case "{namespace}":
			b.WriteString(token(namespace))
		case "{name}":
			b.WriteString(token(name))
		}
		rest = rest[end+1:]
	}
}

func token(s string) string {
	if s == "" {
		return "_"
	}
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			return '_'
		}
		return r
	}, s)
}
