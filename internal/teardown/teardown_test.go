package teardown

import (
	"errors"
	"strings"
	"testing"
)

// TestStack: steps run last pushed first, every one even after failures,
// the failures named in the error, and only once.
func TestStack(t *testing.T) {
	var s Stack
	var order []string
	s.Push("first", func() error { order = append(order, "first"); return nil })
	s.Push("second", func() error { order = append(order, "second"); return errors.New("boom") })
	s.Push("third", func() error { order = append(order, "third"); return nil })
	err := s.Close(nil)
	if strings.Join(order, ",") != "third,second,first" {
		t.Fatalf("order: %v", order)
	}
	if err == nil || err.Error() != "second: boom" {
		t.Fatalf("error: %v", err)
	}
	if again := s.Close(nil); again != err || len(order) != 3 {
		t.Fatalf("a second Close ran steps again or changed its answer: %v %v", order, again)
	}
}
