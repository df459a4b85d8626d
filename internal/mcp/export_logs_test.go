package mcp

type SandboxLogsOut = sandboxLogsOut
