package envd

import (
	"context"
	"strings"

	"connectrpc.com/connect"

	fspb "github.com/airlock-sandbox/airlock/api/gen/filesystem"
)

// legacyClientInterceptor serves old Python SDKs, which identify themselves with
// the User-Agent "connect-python" and fail on any response field their generated
// code does not know (docs/E2B-WIRE.md §3.2). For them, EntryInfo is cut back to name, type
// and path (no symlink type) and filesystem events lose their entry, which is
// everything those SDKs understood. Process responses never changed shape.
type legacyClientInterceptor struct{}

func isLegacyClient(ua string) bool { return strings.HasPrefix(ua, "connect-python") }

func (legacyClientInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err == nil && resp != nil && isLegacyClient(req.Header().Get("User-Agent")) {
			stripForLegacy(resp.Any())
		}
		return resp, err
	}
}

func (legacyClientInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (legacyClientInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if isLegacyClient(conn.RequestHeader().Get("User-Agent")) {
			conn = legacyConn{conn}
		}
		return next(ctx, conn)
	}
}

type legacyConn struct{ connect.StreamingHandlerConn }

func (c legacyConn) Send(msg any) error {
	stripForLegacy(msg)
	return c.StreamingHandlerConn.Send(msg)
}

func stripForLegacy(msg any) {
	switch m := msg.(type) {
	case *fspb.StatResponse:
		stripEntry(m.GetEntry())
	case *fspb.MakeDirResponse:
		stripEntry(m.GetEntry())
	case *fspb.MoveResponse:
		stripEntry(m.GetEntry())
	case *fspb.ListDirResponse:
		for _, e := range m.GetEntries() {
			stripEntry(e)
		}
	case *fspb.WatchDirResponse:
		if fe := m.GetFilesystem(); fe != nil {
			fe.Entry = nil
		}
	case *fspb.GetWatcherEventsResponse:
		for _, fe := range m.GetEvents() {
			fe.Entry = nil
		}
	}
}

func stripEntry(e *fspb.EntryInfo) {
	if e == nil {
		return
	}
	t := e.GetType()
	if t == fspb.FileType_FILE_TYPE_SYMLINK {
		t = fspb.FileType_FILE_TYPE_FILE
	}
	name, path := e.GetName(), e.GetPath()
	e.Reset()
	e.Name, e.Type, e.Path = name, t, path
}
