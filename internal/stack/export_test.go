package stack

// ChildNames lists the command names of this process's children.
func ChildNames() []string {
	var names []string
	for _, p := range childProcs() {
		names = append(names, p.comm)
	}
	return names
}
