package envd

import (
	"sync"

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
	// Chunk limits of spec §3.4: the SDKs decode each chunk incrementally and upstream
	// never sends larger ones.
	maxPipeChunk = 32 << 10
	maxPTYChunk  = 16 << 10

	// subscriberBudget bounds the output queued for one attached stream. A process
	// must never wait for a slow client (it would stall every other subscriber and
	// the process itself), so output beyond this is dropped for that subscriber only.
	subscriberBudget = 4 << 20
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

// subscriber is one attached stream's queue. Publishing never blocks: it appends
// under a mutex and pokes notify, and the stream goroutine drains the queue at its
// own pace.
type subscriber struct {
	mu      sync.Mutex
	queue   []outEvent
	queued  int
	dropped int64
	notify  chan struct{}
}

func newSubscriber() *subscriber {
	return &subscriber{notify: make(chan struct{}, 1)}
}

func (s *subscriber) poke() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// pushData queues a chunk, merging it into the previous chunk of the same kind when
// the result stays within the chunk limit: a client that falls slightly behind then
// receives fewer, larger messages instead of many small ones.
func (s *subscriber) pushData(k outKind, data []byte) {
	s.mu.Lock()
	if s.queued+len(data) > subscriberBudget {
		s.dropped += int64(len(data))
		s.mu.Unlock()
		return
	}
	if n := len(s.queue); n > 0 {
		last := &s.queue[n-1]
		if last.end == nil && last.kind == k && len(last.data)+len(data) <= chunkLimit(k) {
			// Full slice expression forces a copy: last.data may be shared.
			last.data = append(last.data[:len(last.data):len(last.data)], data...)
			s.queued += len(data)
			s.mu.Unlock()
			s.poke()
			return
		}
	}
	s.queue = append(s.queue, outEvent{kind: k, data: data})
	s.queued += len(data)
	s.mu.Unlock()
	s.poke()
}

// pushEnd queues the end event regardless of the budget: it is tiny and every stream
// must see exactly one.
func (s *subscriber) pushEnd(end *pb.ProcessEvent_EndEvent) {
	s.mu.Lock()
	s.queue = append(s.queue, outEvent{end: end})
	s.mu.Unlock()
	s.poke()
}

func (s *subscriber) take() []outEvent {
	s.mu.Lock()
	q := s.queue
	s.queue = nil
	s.queued = 0
	s.mu.Unlock()
	return q
}

func (s *subscriber) droppedBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}
