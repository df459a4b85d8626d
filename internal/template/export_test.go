package template

import "time"

// SetWaitReport sets how often a waiting build repeats what it waits for, and
// returns the function that restores it.
func SetWaitReport(d time.Duration) (restore func()) {
	old := waitReport
	waitReport = d
	return func() { waitReport = old }
}
