package timing

import (
	"context"
	"testing"
	"time"
)

func TestSpansSumByNameInFirstEndOrder(t *testing.T) {
	r := &Recorder{}
	r.Add("b", 2*time.Millisecond)
	r.Add("a", time.Millisecond)
	r.Add("b", 3*time.Millisecond)
	got := r.Spans()
	want := []Span{{"b", 5 * time.Millisecond}, {"a", time.Millisecond}}
	if len(got) != len(want) {
		t.Fatalf("spans = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("spans = %v, want %v", got, want)
		}
	}
}

func TestStartRecordsOnlyWithARecorder(t *testing.T) {
	Start(context.Background(), "nobody")() // no recorder: must not panic

	r := &Recorder{}
	ctx := With(context.Background(), r)
	stop := Start(ctx, "step")
	time.Sleep(2 * time.Millisecond)
	stop()
	spans := r.Spans()
	if len(spans) != 1 || spans[0].Name != "step" || spans[0].D < 2*time.Millisecond {
		t.Fatalf("spans = %v, want one step of at least 2ms", spans)
	}
	if From(context.WithoutCancel(ctx)) != r {
		t.Fatal("the recorder did not survive WithoutCancel")
	}
}

func TestServerTimingRoundTrip(t *testing.T) {
	in := []Span{{"resolve", 1500 * time.Microsecond}, {"rt.start", 12 * time.Millisecond}, {"bad name;x", time.Millisecond}}
	h := ServerTiming(in)
	if h != "resolve;dur=1.500, rt.start;dur=12.000, bad_name_x;dur=1.000" {
		t.Fatalf("header = %q", h)
	}
	out := ParseServerTiming(h)
	if len(out) != 3 || out[0] != in[0] || out[1] != in[1] || out[2].Name != "bad_name_x" {
		t.Fatalf("parsed %v from %q", out, h)
	}
}

func TestParseServerTimingSkipsWhatItCannotRead(t *testing.T) {
	got := ParseServerTiming(`cache;desc="hit", db;dur=abc, ;dur=1, app;dur=2.5;desc=x, `)
	if len(got) != 1 || got[0].Name != "app" || got[0].D != 2500*time.Microsecond {
		t.Fatalf("parsed %v", got)
	}
}
