package doctor

import (
	"context"
	"fmt"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// checkHandover asks the kubelet's PodResources API whether containers
// still hold GPUs the device-plugin shim handed out: the plugin refuses to
// take the node over until it is drained of them (driver.CheckNoShimPods),
// and the doctor says so first, naming the pods.
func (e *examination) checkHandover(ctx context.Context) {
	c := Check{Name: "handover", Status: OK}
	fail := func(summary string, details []string, fix string) {
		c.Status, c.Summary, c.Details, c.Fix = Fail, summary, details, fix
		e.add(c)
	}
	pr, err := podresources.NewClient(e.opts.PodResourcesSocket)
	if err != nil {
		fail(err.Error(), nil, "set --pod-resources-socket to the kubelet's <root-dir>/pod-resources/kubelet.sock")
		return
	}
	defer pr.Close()
	l, err := pr.List(ctx)
	if err != nil {
		fail("the kubelet's PodResources API cannot be asked which pods hold GPUs of the device-plugin shim", []string{err.Error()},
			"mount the kubelet's pod-resources directory and set --pod-resources-socket to its kubelet.sock (or empty where the node is known to be drained of the shim's pods): the plugin refuses to start while it cannot ask")
		return
	}
	var resources, ids, claims []string
	if e.node != nil {
		for _, prof := range e.node.Plan.Profiles {
			resources = append(resources, prof.Resource)
		}
		ids = e.node.Plan.ShimDeviceIDs()
	}
	// As the plugin asks (its handover check): the MIG journal's seats of
	// the shim too; a journal that cannot be read is the MIG checks'.
	records, _, _ := miginstance.ReadJournal(driver.PluginDir(e.opts.PluginsDir))
	for _, r := range records {
		claims = append(claims, string(r.Claim))
	}
	if holders := l.Holders(driver.ShimDevices(resources, ids, claims)); len(holders) > 0 {
		fail(fmt.Sprintf("%d containers hold GPUs the device-plugin shim handed out", len(holders)), holders,
			"drain the node of these pods (kubectl drain <node> --ignore-daemonsets, or delete them) before the DRA plugin takes it over: the plugin refuses to start until then, since it would hand their GPUs out again and destroy the MIG instances of their seats")
		return
	}
	c.Summary = fmt.Sprintf("no container of the kubelet's %d pods holds a GPU of the device-plugin shim", len(l.Pods))
	e.add(c)
}
