package mcp

// For events_test.go (package mcp_test).
type SandboxEventsOut = sandboxEventsOut
