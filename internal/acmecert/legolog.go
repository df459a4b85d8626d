package acmecert

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	legolog "github.com/go-acme/lego/v4/log"
)

// lego logs through one package-level logger; route it to slog once, to the
// logger of the first Source.
var legoLogOnce sync.Once

func routeLegoLog(l *slog.Logger) {
	legoLogOnce.Do(func() { legolog.Logger = slogAdapter{l.With("component", "lego")} })
}

// slogAdapter is lego's StdLogger over slog. lego prefixes its lines with
// "[INFO] ", "[WARN] "; the prefix becomes the level.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) log(msg string) {
	msg = strings.TrimRight(msg, "\n")
	level := slog.LevelInfo
	for p, lv := range map[string]slog.Level{"[INFO] ": slog.LevelInfo, "[WARN] ": slog.LevelWarn} {
		if strings.HasPrefix(msg, p) {
			msg, level = strings.TrimPrefix(msg, p), lv
		}
	}
	a.l.Log(context.Background(), level, msg)
}

func (a slogAdapter) Print(args ...any)                 { a.log(fmt.Sprint(args...)) }
func (a slogAdapter) Println(args ...any)               { a.log(fmt.Sprintln(args...)) }
func (a slogAdapter) Printf(format string, args ...any) { a.log(fmt.Sprintf(format, args...)) }
func (a slogAdapter) Fatal(args ...any)                 { a.Print(args...); os.Exit(1) }
func (a slogAdapter) Fatalln(args ...any)               { a.Println(args...); os.Exit(1) }
func (a slogAdapter) Fatalf(format string, args ...any) { a.Printf(format, args...); os.Exit(1) }
