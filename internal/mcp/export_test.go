package mcp

// For the external test package (http_test.go, package mcp_test): it starts a
// whole server through internal/daemon, which imports this package, so it
// cannot live inside it.
var (
	Call       = call
	Text       = text
	Structured = structured
)

type (
	SandboxOut       = sandboxOut
	RunCommandOut    = runCommandOut
	GetMetricsOut    = getMetricsOut
	ListFilesOut     = listFilesOut
	ListSandboxesOut = listSandboxesOut
	ReadFileOut      = readFileOut
	RunCodeOut       = runCodeOut
)

type (
	PauseOut         = pauseOut
	ResumeOut        = resumeOut
	SnapshotOut      = snapshotOut
	ForkOut          = forkOut
	ListSnapshotsOut = listSnapshotsOut
	BuildTemplateOut = buildTemplateOut
	DirListingOut    = dirListingOut
)
