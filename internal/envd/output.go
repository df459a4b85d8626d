package envd

import (
	"sync"
	"time"

	pb "github.com/airlock-sandbox/airlock/api/gen/process"
)

// outKind says which DataEvent field a chunk of output travels in.
type outKind uint8

const (
	outStdout outKind = iota
	outStderr
	outPTY
)

const (
	// Chunk limits of docs/E2B-WIRE.md §3.4: the SDKs decode each chunk incrementally and upstream
	// never sends larger ones.
	maxPipeChunk = 32 << 10
	maxPTYChunk  = 16 << 10

	// subscriberBudget bounds the output queued for one attached stream.
	subscriberBudget = 4 << 20
	// subscriberStall is the longest a process's output waits for one subscriber
	// whose queue is full. A client that keeps reading (even slower than the
	// process writes) loses nothing: the process is throttled the way a pipe would
	// throttle it. A client that stops reading for this long is marked lagging and
	// loses output instead, so it can neither stall the process (and every other
	// subscriber) for long nor make envd buffer without bound.
	subscriberStall = 2 * time.Second
)

func chunkLimit(k outKind) int {
	if k == outPTY {
		return maxPTYChunk
	}
	return maxPipeChunk
}

type outEvent struct {
	kind outKind
	data []byte // shared between subscribers; never mutated after publish
	end  *pb.ProcessEvent_EndEvent
}

// subscriber is one attached stream's queue, filled by the process's output
// readers and drained by the stream's goroutine.
type subscriber struct {
	mu      sync.Mutex
	queue   []outEvent
	queued  int
	dropped int64
	lagging bool // stopped reading; drop instead of waiting until it catches up
	ended   bool // the end event is queued; nothing may follow it
	notify  chan struct{}
	space   chan struct{} // poked when the stream drained its queue
	gone    chan struct{} // closed when the stream detaches
	goneOne sync.Once
}

func newSubscriber() *subscriber {
	return &subscriber{notify: make(chan struct{}, 1), space: make(chan struct{}, 1), gone: make(chan struct{})}
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (s *subscriber) detach() { s.goneOne.Do(func() { close(s.gone) }) }

// tryPush queues a chunk if it fits (or drops it for a lagging subscriber) and
// reports false only when the caller should wait for space. Chunks merge into the
// previous chunk of the same kind while within the chunk limit, so a client that
// falls behind receives fewer, larger messages.
func (s *subscriber) tryPush(k outKind, data []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return true
	}
	if s.queued+len(data) > subscriberBudget {
		if s.lagging {
			s.dropped += int64(len(data))
			return true
		}
		return false
	}
	if n := len(s.queue); n > 0 {
		last := &s.queue[n-1]
		if last.end == nil && last.kind == k && len(last.data)+len(data) <= chunkLimit(k) {
			// The full slice expression forces a copy: last.data may be shared.
			last.data = append(last.data[:len(last.data):len(last.data)], data...)
			s.queued += len(data)
			poke(s.notify)
			return true
		}
	}
	s.queue = append(s.queue, outEvent{kind: k, data: data})
	s.queued += len(data)
	poke(s.notify)
	return true
}

// pushWait waits up to subscriberStall for room, then gives up on the subscriber
// until it catches up.
func (s *subscriber) pushWait(k outKind, data []byte) {
	timer := time.NewTimer(subscriberStall)
	defer timer.Stop()
	for !s.tryPush(k, data) {
		select {
		case <-s.space:
		case <-s.gone:
			return
		case <-timer.C:
			s.mu.Lock()
			s.lagging = true
			s.dropped += int64(len(data))
			s.mu.Unlock()
			return
		}
	}
}

// pushEnd queues the end event regardless of the budget: it is tiny and every
// stream must see exactly one.
func (s *subscriber) pushEnd(end *pb.ProcessEvent_EndEvent) {
	s.mu.Lock()
	s.queue = append(s.queue, outEvent{end: end})
	s.ended = true
	s.mu.Unlock()
	poke(s.notify)
}

func (s *subscriber) take() []outEvent {
	s.mu.Lock()
	q := s.queue
	s.queue = nil
	s.queued = 0
	s.lagging = false
	s.mu.Unlock()
	poke(s.space)
	return q
}

func (s *subscriber) droppedBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}
