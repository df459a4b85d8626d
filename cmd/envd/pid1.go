package main

// pid1.c is the sandbox's pid 1: a reaper that runs before the Go runtime
// and forks this process into the server. It is why envd is built with cgo,
// linked statically (envd runs inside arbitrary root filesystems); a build
// without cgo fails on the C file rather than make an envd that would leave
// a sandbox's orphans unreaped.

// #cgo LDFLAGS: -static
import "C"
