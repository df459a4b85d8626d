package runtime

// NetNSSpender is implemented by a Runtime whose sandboxes use up the network
// namespace they join (Spec.NetNS): gVisor's netstack takes over the
// namespace's interfaces and strips their addresses, and never gives them
// back. A Create or Restore after a Release must then be given a namespace the
// caller rebuilt (or readdressed), or the sandbox comes up without a network.
// A backend that does not implement it leaves the namespace as it found it.
type NetNSSpender interface {
	SpendsNetNS() bool
}
