package tplbuild

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"
)

// BuildInfo is one API build of a template as its record tells it.
type BuildInfo struct {
	TemplateID string
	BuildID    string
	Status     string // Status*
	Reason     *Reason
	Tags       []string
	CPUCount   int
	MemoryMB   int
	CreatedAt  time.Time
	FinishedAt time.Time // zero while waiting or building
}

// Builds lists the records of templateID's API builds, newest first: what
// the server was asked to build and how that went (a ready build may since
// have been dropped by the store, when no tag names it any more). Records
// are kept for recordTTL after they finish.
func (s *Service) Builds(templateID string) ([]BuildInfo, error) {
	return s.records(func(r record) bool { return r.TemplateID == templateID })
}

// OwnedBy lists the records of owner's API builds of every template, newest
// first: the dashboard's way to a template whose first build is under way
// (the store lists a template once a build of it is ready).
func (s *Service) OwnedBy(owner string) ([]BuildInfo, error) {
	return s.records(func(r record) bool { return r.Owner == owner })
}

func (s *Service) records(keep func(record) bool) ([]BuildInfo, error) {
	ents, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("template builds: %w", err)
	}
	var out []BuildInfo
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if e.IsDir() || !ok || strings.HasPrefix(id, ".") {
			continue
		}
		r, err := s.readRecord(id)
		if errors.Is(err, fs.ErrNotExist) {
			continue // forgotten meanwhile
		}
		if err != nil {
			s.log.Warn("template builds: unreadable record skipped", "build", id, "err", err)
			continue
		}
		if !keep(r) {
			continue
		}
		// The in-memory job is ahead of its record only in fields the
		// record is rewritten for; reading the file is enough.
		out = append(out, BuildInfo{
			TemplateID: r.TemplateID, BuildID: r.BuildID, Status: r.Status, Reason: r.Reason, Tags: r.Tags,
			CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, CreatedAt: r.CreatedAt, FinishedAt: r.FinishedAt,
		})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}
