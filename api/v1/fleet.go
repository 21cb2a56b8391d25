package v1

import "strings"

// Many clusters, one desired state (docs/fleet.md): each cluster runs its
// bridge next to a NATS of its own, a leaf node of a hub whose JetStream
// domain is the cluster's name. The hub's FleetStream sources every
// cluster's stream, with the cluster inserted after the subject prefix
// (student.created in cluster east is student.east.created on the hub);
// services on the hub report receipts into FleetReceiptsBucket under
// FleetReceiptKey, and each cluster's receipts bucket sources its own.
const (
	// FleetStream is the hub's stream of every cluster's events.
	FleetStream = "STUDENTS_FLEET"
	// FleetReceiptsBucket is the hub's receipts bucket.
	FleetReceiptsBucket = "STUDENT_FLEET_RECEIPTS"
	// DefaultHubDomain is the hub's JetStream domain.
	DefaultHubDomain = "hub"
)

// FleetReceiptKey is the key of service's receipt for the Student with uid
// in cluster, in the hub's receipts bucket; the cluster's bucket holds it
// as ReceiptKey(service, uid).
func FleetReceiptKey(cluster, service, uid string) string {
	return cluster + "." + ReceiptKey(service, uid)
}

// FleetSubjects is what the hub's stream holds of cluster's events, for a
// bridge publishing under prefix: prefix.cluster.>.
func FleetSubjects(prefix, cluster string) string { return prefix + "." + cluster + ".>" }

// DomainAPI is the JetStream API prefix of a domain ($JS.<domain>.API):
// how the hub's stream sources a cluster's, and a cluster's receipts
// bucket the hub's.
func DomainAPI(domain string) string { return "$JS." + domain + ".API" }

// DomainOfAPI returns the domain a JetStream API prefix names, or false
// when it is not DomainAPI's.
func DomainOfAPI(prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(prefix, "$JS.")
	domain, ok2 := strings.CutSuffix(rest, ".API")
	return domain, ok && ok2 && domain != ""
}

// ValidClusterName reports whether name can name a cluster of a fleet: a
// JetStream domain, a subject token and a key token (letters, digits, '-'
// and '_', up to 63).
func ValidClusterName(name string) bool { return ValidServiceName(name) }

// ClusterOfSource returns the cluster a CloudEvent source names
// (/clusters/<cluster>/apis/...), or "" when it names none.
func ClusterOfSource(source string) string {
	rest, ok := strings.CutPrefix(source, "/clusters/")
	if !ok {
		return ""
	}
	cluster, _, ok := strings.Cut(rest, "/")
	if !ok {
		return ""
	}
	return cluster
}
