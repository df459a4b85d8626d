package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// LeaseName is the Lease the replicas elect the reconciler with.
const LeaseName = "airlock-reconciler"

// Reconciler settings: how long a replica holds the Lease without
// renewing it, and how often the holder reconciles.
const (
	leaseDuration = 6 * time.Second
	renewDeadline = 4 * time.Second
	retryPeriod   = time.Second
	// ReconcileEvery is how often the holder of the Lease reconciles: the
	// timeouts' precision.
	ReconcileEvery = time.Second
)

// RunReconciler takes part in the replicas' election of the reconciler
// (the Lease LeaseName in the backend's namespace) until ctx ends, and
// reconciles every ReconcileEvery (and samples every SampleEvery) while
// it holds the Lease. A replica that
// dies loses the Lease within leaseDuration, and another takes over.
func (b *Backend) RunReconciler(ctx context.Context, identity string) {
	if identity == "" {
		host, _ := os.Hostname()
		identity = host + "-" + newID()[:6]
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: b.Pods.Namespace},
		Client:     b.Pods.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
			ReleaseOnCancel: true, Name: LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					b.log().Info("this replica reconciles the sandboxes", "identity", identity)
					go b.sampleEvery(ctx)
					t := time.NewTicker(ReconcileEvery)
					defer t.Stop()
					for {
						if err := b.Reconcile(ctx); err != nil && ctx.Err() == nil {
							b.log().Error("reconciling sandboxes", "err", err)
						}
						if err := b.FillPools(ctx); err != nil && ctx.Err() == nil {
							b.log().Warn("filling the warm pools", "err", err)
						}
						select {
						case <-ctx.Done():
							return
						case <-t.C:
						}
					}
				},
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			b.log().Error("reconciler election", "err", err)
			return
		}
		le.Run(ctx) // returns when the Lease is lost or ctx ends
	}
}

// sampleEvery samples the sandboxes every SampleEvery until ctx ends.
func (b *Backend) sampleEvery(ctx context.Context) {
	t := time.NewTicker(SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := b.Sample(ctx); err != nil && ctx.Err() == nil {
			b.log().Warn("sampling sandboxes", "err", err)
		}
	}
}

// orphanAfter is how old a Pod no record names (or a record whose create
// never finished) must be before the reconciler deletes it: longer than
// any create takes.
func (b *Backend) orphanAfter() time.Duration {
	return b.Pods.readyTimeout() + time.Minute
}

// Reconcile makes the records and the Pods agree, once:
//   - a sandbox past its end is killed (reason timeout);
//   - a running sandbox whose Pod ended or is gone is killed with what
//     Kubernetes said (OOM, init exited, or its Pod lost), and what is
//     left of its Pod deleted;
//   - a record whose create never finished (its replica died) and a Pod
//     that no record names (warm Pods aside) are deleted once older than
//     any create.
//
// It is meant for one replica at a time (RunReconciler); run by two at
// once, a sandbox could get two killed events.
func (b *Backend) Reconcile(ctx context.Context) error {
	recs, err := b.Records.List(ctx)
	if err != nil {
		return fmt.Errorf("listing records: %w", err)
	}
	pods := b.Pods.listed()
	now := b.now()
	var errs []error
	named := map[string]bool{}
	for _, r := range recs {
		named[r.ID] = true
		info := sandbox.FromRecord(r)
		switch info.State {
		case sandbox.StateCreating:
			if now.Sub(info.StartedAt) > b.orphanAfter() {
				b.log().Warn("deleting a sandbox whose create never finished", "sandbox", info.ID)
				if err := b.Records.Delete(ctx, info.ID); err != nil {
					errs = append(errs, err)
				} else if err := b.Pods.Delete(ctx, info.ID); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		case sandbox.StateRunning:
		default:
			continue
		}
		pod, ok := pods[info.ID]
		if !ok {
			// The informer may lag behind a create of another replica's:
			// the API server says whether the Pod is really gone.
			p, err := b.Pods.Client.CoreV1().Pods(b.Pods.Namespace).Get(ctx, PodName(info.ID), metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				_, why := deletedBehindBack(PodName(info.ID))
				errs = append(errs, b.end(ctx, info, lifecycle.KillPodLost, why, why))
				continue
			case err != nil:
				errs = append(errs, err)
				continue
			}
			pod = p
		}
		if kill, why := ended(pod); why != "" {
			errs = append(errs, b.end(ctx, info, kill, why, why))
			continue
		}
		if !info.EndAt.After(now) {
			errs = append(errs, b.end(ctx, info, lifecycle.KillTimeout, "", "its timeout was reached"))
		}
	}
	for id, pod := range pods {
		if !named[id] && pod.Labels[LabelWarm] == "" && pod.DeletionTimestamp == nil && now.Sub(pod.CreationTimestamp.Time) > b.orphanAfter() {
			// Listed before the Pods: check the record again, since a
			// create may have written it since.
			if _, err := b.Records.Get(ctx, id); err == nil {
				continue
			}
			b.log().Warn("deleting a sandbox Pod no record names", "pod", pod.Name)
			errs = append(errs, b.Pods.Delete(ctx, id))
		}
	}
	return errors.Join(errs...)
}
