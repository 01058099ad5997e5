package draplugin

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// republishAfterWipe is how long the plugin waits after its slices were
// deleted before it publishes again: long enough for the resourceslice
// controller's own informer to see the deletion too.
const republishAfterWipe = time.Second

// watchForWipes publishes again soon after this node's slices are deleted
// by someone else. The kubelet deletes every ResourceSlice of its node when
// it starts; the resourceslice controller would only notice at its next
// sync, up to 30 seconds later, leaving the node without seats meanwhile.
// It returns when ctx ends, after its informer stopped.
func (p *publisher) watchForWipes(ctx context.Context, to slicePublisher) {
	logger := klog.FromContext(ctx)
	selector := fields.Set{
		resourceapi.ResourceSliceSelectorNodeName: p.node.Pool,
		resourceapi.ResourceSliceSelectorDriver:   driver.Name,
	}.String()
	// The one informer this needs, not a factory: a factory links an
	// informer and a lister for every API group into the binary.
	inf := resourceinformers.NewFilteredResourceSliceInformer(p.client, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = selector
	})
	wiped := make(chan struct{}, 1)
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(any) {
			select {
			case wiped <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		logger.Error(err, "Cannot watch this node's ResourceSlices; slices deleted by a kubelet restart come back at the next resync")
		return
	}
	informerDone := make(chan struct{})
	go func() {
		defer close(informerDone)
		inf.RunWithContext(ctx)
	}()
	defer func() { <-informerDone }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wiped:
		}
		select {
		case <-ctx.Done():
			return
		case <-p.clock.After(republishAfterWipe):
		}
		logger.V(2).Info("ResourceSlices of this node were deleted (the kubelet removes them when it starts); publishing again")
		if err := p.publish(ctx, to); err != nil {
			logger.Error(err, "Cannot publish ResourceSlices again")
		}
	}
}
