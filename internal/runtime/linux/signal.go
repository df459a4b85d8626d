package linux

import (
	"fmt"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// SignalInit implements runtime.InitSignaler: libcontainer signals the init
// process (also one CRIU restored, and one loaded after a restart).
func (s *sandbox) SignalInit(sig syscall.Signal) error {
	if s.c == nil {
		return fmt.Errorf("linux runtime: signal: sandbox %s is released", s.id)
	}
	if err := s.c.Signal(sig); err != nil {
		return fmt.Errorf("linux runtime: signal %s: %w", s.id, err)
	}
	return nil
}

var _ runtime.InitSignaler = (*sandbox)(nil)
