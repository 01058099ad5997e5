package draplugin

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// startEvents records Kubernetes Events on the node object.
func (d *Driver) startEvents(ctx context.Context) {
	d.nodeRef = &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: d.opts.NodeName}
	getCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if node, err := d.client.CoreV1().Nodes().Get(getCtx, d.opts.NodeName, metav1.GetOptions{}); err == nil {
		d.nodeRef.UID = node.UID
	} else {
		klog.FromContext(ctx).V(2).Info("Cannot read the Node object; events will name it without its UID", "err", err)
	}
	d.broadcaster = events.NewBroadcaster(&events.EventSinkImpl{Interface: d.client.EventsV1()})
	d.broadcaster.StartRecordingToSink(ctx.Done())
	d.recorder = d.broadcaster.NewRecorder(scheme.Scheme, driver.Name)
}

// warnOnce records a Warning event the first time a note is seen.
func (d *Driver) warnOnce(reason, note string) {
	d.layoutMu.Lock()
	if d.warned == nil {
		d.warned = map[string]bool{}
	}
	seen := d.warned[note]
	d.warned[note] = true
	d.layoutMu.Unlock()
	if !seen {
		d.event(corev1.EventTypeWarning, reason, note)
	}
}

func (d *Driver) event(eventType, reason, note string) {
	if d.recorder == nil {
		return
	}
	d.recorder.Eventf(d.nodeRef, nil, eventType, reason, reason, "%s", note)
}
