// Package teardown is a server's teardown as an explicit stack of named
// closers: each step of a start pushes what undoes it, and Close runs them
// last pushed first, the same code after a failed start and at shutdown.
package teardown

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// Stack holds the closers; the zero value is empty and ready.
type Stack struct {
	closers []closer
	once    sync.Once
	err     error
}

type closer struct {
	name  string
	close func() error
}

// Push adds a step; Close runs it before every step pushed earlier.
func (s *Stack) Push(name string, fn func() error) {
	s.closers = append(s.closers, closer{name, fn})
}

// Close runs every step, last pushed first, logs each failure to log
// (nil: slog's default) and returns them all, each named. Only the first
// call runs them; later calls return its result.
func (s *Stack) Close(log *slog.Logger) error {
	s.once.Do(func() {
		if log == nil {
			log = slog.Default()
		}
		var errs []error
		for i := len(s.closers) - 1; i >= 0; i-- {
			c := s.closers[i]
			if err := c.close(); err != nil {
				log.Warn("close "+c.name, "err", err)
				errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
			}
		}
		s.closers = nil
		s.err = errors.Join(errs...)
	})
	return s.err
}
