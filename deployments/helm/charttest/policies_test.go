//go:build charttest

package charttest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// The admission policies' CEL is evaluated here with cel-go, the way the API
// server evaluates a ValidatingAdmissionPolicy: match conditions first, then
// the variables in order, then every validation, with the failure policy
// Fail (an expression that errors refuses the request). It proves the logic
// of the expressions on requests written out by hand; that the API server
// compiles them against its own types is for the end-to-end tests.

const (
	pluginUser  = "system:serviceaccount:kyb-system:kyb-kyb-dra-driver"
	nodeNameKey = "authentication.kubernetes.io/node-name"
)

// admission is a request as a policy sees it.
type admission struct {
	operation string
	user      string
	node      string // the node in the token; "" for none
	object    map[string]any
	oldObject map[string]any
}

// verdict is what the policy decided.
type verdict struct {
	matched  bool
	denied   bool
	messages []string
}

func evaluate(t *testing.T, vap *admissionv1.ValidatingAdmissionPolicy, req admission) verdict {
	t.Helper()
	env, err := cel.NewEnv(
		cel.Variable("request", cel.DynType),
		cel.Variable("object", cel.DynType),
		cel.Variable("oldObject", cel.DynType),
		cel.Variable("variables", cel.MapType(cel.StringType, cel.DynType)),
	)
	if err != nil {
		t.Fatal(err)
	}
	extra := map[string]any{}
	if req.node != "" {
		extra[nodeNameKey] = []any{req.node}
	}
	vars := map[string]any{}
	activation := map[string]any{
		"request": map[string]any{
			"operation": req.operation,
			"userInfo":  map[string]any{"username": req.user, "extra": extra},
		},
		"object":    nullable(req.object),
		"oldObject": nullable(req.oldObject),
		"variables": vars,
	}
	eval := func(expr string) (ref.Val, error) {
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("compile %q: %v", expr, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatalf("program %q: %v", expr, err)
		}
		out, _, err := prg.Eval(activation)
		if err != nil {
			return nil, err
		}
		return out, nil
	}
	for _, mc := range vap.Spec.MatchConditions {
		v, err := eval(mc.Expression)
		if err != nil {
			t.Fatalf("match condition %s: %v", mc.Name, err)
		}
		if v != types.True {
			return verdict{}
		}
	}
	for _, v := range vap.Spec.Variables {
		val, err := eval(v.Expression)
		if err != nil {
			return verdict{matched: true, denied: true, messages: []string{fmt.Sprintf("variable %s: %v", v.Name, err)}}
		}
		vars[v.Name] = val
	}
	result := verdict{matched: true}
	for _, v := range vap.Spec.Validations {
		ok, err := eval(v.Expression)
		if err == nil && ok == types.True {
			continue
		}
		result.denied = true
		msg := v.Message
		switch {
		case err != nil:
			msg = fmt.Sprintf("expression failed: %v", err)
		case v.MessageExpression != "":
			m, err := eval(v.MessageExpression)
			if err != nil {
				t.Fatalf("messageExpression %q: %v", v.MessageExpression, err)
			}
			msg = fmt.Sprint(m.Value())
		}
		result.messages = append(result.messages, strings.TrimSpace(msg))
	}
	return result
}

func nullable(m map[string]any) any {
	if m == nil {
		return types.NullValue
	}
	return m
}

func obj(t *testing.T, y string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := sigsyaml.Unmarshal([]byte(y), &m); err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	return m
}

func policies(t *testing.T) map[string]*admissionv1.ValidatingAdmissionPolicy {
	m := render(t, nil)
	out := map[string]*admissionv1.ValidatingAdmissionPolicy{}
	for _, o := range m.ofKind("ValidatingAdmissionPolicy") {
		var vap admissionv1.ValidatingAdmissionPolicy
		decode(t, o, &vap)
		out[strings.TrimPrefix(vap.Name, "kyb-kyb-dra-driver-kyb-system-")] = &vap
	}
	if len(out) != 3 || out["resourceslices"] == nil || out["claim-status"] == nil || out["events"] == nil {
		t.Fatalf("admission policies %v", out)
	}
	return out
}

func slice(t *testing.T, node string) map[string]any {
	if node == "" {
		return obj(t, "spec: {driver: gpu.kyb.ai, allNodes: true, pool: {name: cluster, generation: 1, resourceSliceCount: 1}}")
	}
	return obj(t, fmt.Sprintf("spec: {driver: gpu.kyb.ai, nodeName: %s, pool: {name: %s, generation: 1, resourceSliceCount: 2}}", node, node))
}

// sliceOf is a slice of driver on node in pool.
func sliceOf(t *testing.T, driver, node, pool string) map[string]any {
	return obj(t, fmt.Sprintf("spec: {driver: %s, nodeName: %s, pool: {name: %s, generation: 1, resourceSliceCount: 1}}", driver, node, pool))
}

func TestSlicePolicyKeepsEachPluginOnItsNode(t *testing.T) {
	vap := policies(t)["resourceslices"]
	for _, tc := range []struct {
		name        string
		req         admission
		wantMatched bool
		wantDenied  bool
		wantMessage string
	}{
		{name: "create on its node", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: slice(t, "node-a")}, wantMatched: true},
		{name: "update on its node", req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", object: slice(t, "node-a"), oldObject: slice(t, "node-a")}, wantMatched: true},
		{name: "delete on its node", req: admission{operation: "DELETE", user: pluginUser, node: "node-a", oldObject: slice(t, "node-a")}, wantMatched: true},
		{
			name: "create on another node", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: slice(t, "node-b")},
			wantMatched: true, wantDenied: true, wantMessage: `the kyb DRA plugin on node node-a may change only the ResourceSlices of its own node, not of node "node-b"`,
		},
		{
			name: "delete on another node", req: admission{operation: "DELETE", user: pluginUser, node: "node-a", oldObject: slice(t, "node-b")},
			wantMatched: true, wantDenied: true, wantMessage: `not of node "node-b"`,
		},
		{
			name: "move another node's slice to its node", req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", object: slice(t, "node-a"), oldObject: slice(t, "node-b")},
			wantMatched: true, wantDenied: true, wantMessage: `not of node "node-b"`,
		},
		{
			name: "create a slice for all nodes", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: slice(t, "")},
			wantMatched: true, wantDenied: true, wantMessage: `not of node ""`,
		},
		{
			name: "a token without a node", req: admission{operation: "CREATE", user: pluginUser, object: slice(t, "node-a")},
			wantMatched: true, wantDenied: true, wantMessage: "the kyb DRA plugin's ServiceAccount token names no node",
		},
		{
			name: "create another driver's slice on its node", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: sliceOf(t, "gpu.nvidia.com", "node-a", "node-a")},
			wantMatched: true, wantDenied: true, wantMessage: `the kyb DRA plugin on node node-a may change only the ResourceSlices of driver gpu.kyb.ai, not of driver "gpu.nvidia.com"`,
		},
		{
			name: "delete another driver's slice on its node", req: admission{operation: "DELETE", user: pluginUser, node: "node-a", oldObject: sliceOf(t, "gpu.nvidia.com", "node-a", "node-a")},
			wantMatched: true, wantDenied: true, wantMessage: `not of driver "gpu.nvidia.com"`,
		},
		{
			name: "take over another driver's slice", req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", object: slice(t, "node-a"), oldObject: sliceOf(t, "gpu.nvidia.com", "node-a", "node-a")},
			wantMatched: true, wantDenied: true, wantMessage: `not of driver "gpu.nvidia.com"`,
		},
		{
			name: "create a slice of another pool on its node", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: sliceOf(t, "gpu.kyb.ai", "node-a", "spare-pool")},
			wantMatched: true, wantDenied: true, wantMessage: `the kyb DRA plugin on node node-a may change only the slices of its own pool "node-a", not of pool "spare-pool"`,
		},
		{
			name: "move its slice to another pool", req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", object: sliceOf(t, "gpu.kyb.ai", "node-a", "node-b"), oldObject: slice(t, "node-a")},
			wantMatched: true, wantDenied: true, wantMessage: `not of pool "node-b"`,
		},
		{name: "another user is not the policy's business", req: admission{operation: "DELETE", user: "system:serviceaccount:kube-system:resourceclaim-controller", oldObject: slice(t, "node-b")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := evaluate(t, vap, tc.req)
			checkVerdict(t, got, tc.wantMatched, tc.wantDenied, tc.wantMessage)
		})
	}
}

// A node's pool declares no more slices than the driver publishes for
// the largest node: a plugin broken into cannot make the scheduler read a
// pool of any size (a pool is used only once all the slices it declares
// are listed). Deleting a slice is never refused for it.
func TestSlicePolicyBoundsAPoolsSlices(t *testing.T) {
	vap := policies(t)["resourceslices"]
	most := draresources.MaxPoolSlices()
	withCount := func(n int) map[string]any {
		return obj(t, fmt.Sprintf("spec: {driver: gpu.kyb.ai, nodeName: node-a, pool: {name: node-a, generation: 3, resourceSliceCount: %d}}", n))
	}
	for _, tc := range []struct {
		name        string
		req         admission
		wantDenied  bool
		wantMessage string
	}{
		{name: "the largest pool", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: withCount(most)}},
		{
			name: "one slice more", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: withCount(most + 1)},
			wantDenied: true, wantMessage: fmt.Sprintf("the kyb DRA plugin on node node-a may publish a pool of at most %d slices, the most the driver publishes, not %d", most, most+1),
		},
		{
			name: "a slice updated into a larger pool", req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", object: withCount(512), oldObject: withCount(2)},
			wantDenied: true, wantMessage: "not 512",
		},
		{name: "a slice of a larger pool deleted", req: admission{operation: "DELETE", user: pluginUser, node: "node-a", oldObject: withCount(512)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkVerdict(t, evaluate(t, vap, tc.req), true, tc.wantDenied, tc.wantMessage)
		})
	}
}

func checkVerdict(t *testing.T, got verdict, matched, denied bool, message string) {
	t.Helper()
	if got.matched != matched || got.denied != denied {
		t.Fatalf("matched %v, denied %v (%q); want matched %v, denied %v", got.matched, got.denied, got.messages, matched, denied)
	}
	if message != "" && !strings.Contains(strings.Join(got.messages, "\n"), message) {
		t.Errorf("messages %q lack %q", got.messages, message)
	}
}

// claim returns a claim allocated on node (none for ""), reserved for one
// pod, with a status entry of this driver and one of another driver.
func claim(t *testing.T, node string) map[string]any {
	if node == "" {
		return obj(t, "spec: {devices: {requests: [{name: seat}]}}\nstatus: {}")
	}
	return obj(t, fmt.Sprintf(`
spec: {devices: {requests: [{name: seat}]}}
status:
  allocation:
    devices:
      results:
      - {request: seat, driver: gpu.kyb.ai, pool: %[1]s, device: g01-2x, shareID: 5e7b6a3c-0d5b-4e39-9b2a-6a1f3c2d1e01}
      - {request: nic, driver: nic.example.com, pool: %[1]s, device: nic-0}
    nodeSelector:
      nodeSelectorTerms:
      - matchFields:
        - {key: metadata.name, operator: In, values: [%[1]s]}
  reservedFor:
  - {resource: pods, name: trainer-0, uid: 7d9c0f4e-1111-4a2b-8c3d-222222222222}
  devices:
  - {driver: nic.example.com, pool: %[1]s, device: nic-0, data: {mac: "02:00:00:00:00:01"}}
`, node))
}

// withSeatStatus adds (or replaces) this driver's status entry, as the
// plugin's server-side apply does.
func withSeatStatus(t *testing.T, c map[string]any) map[string]any {
	out := obj(t, mustYAML(t, c))
	status := out["status"].(map[string]any)
	devices, _ := status["devices"].([]any)
	devices = append(devices, obj(t, `{driver: gpu.kyb.ai, pool: node-a, device: g01-2x, shareID: 5e7b6a3c-0d5b-4e39-9b2a-6a1f3c2d1e01, data: {profile: 2x, group: G01, gpus: [0, 1], seats: [1], generations: [3]}}`))
	status["devices"] = devices
	return out
}

func mustYAML(t *testing.T, v any) string {
	b, err := sigsyaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestClaimStatusPolicyKeepsEachPluginToItsOwnEntries(t *testing.T) {
	vap := policies(t)["claim-status"]
	here := claim(t, "node-a")
	mutate := func(c map[string]any, f func(status map[string]any)) map[string]any {
		c = obj(t, mustYAML(t, c))
		f(c["status"].(map[string]any))
		return c
	}
	for _, tc := range []struct {
		name        string
		req         admission
		wantMatched bool
		wantDenied  bool
		wantMessage string
	}{
		{
			name: "its seats in a claim on its node", wantMatched: true,
			req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", oldObject: here, object: withSeatStatus(t, here)},
		},
		{
			name: "a claim on another node", wantMatched: true, wantDenied: true,
			wantMessage: "the kyb DRA plugin on node node-b may write the status only of claims allocated on its own node",
			req:         admission{operation: "UPDATE", user: pluginUser, node: "node-b", oldObject: here, object: withSeatStatus(t, here)},
		},
		{
			name: "a claim not allocated", wantMatched: true, wantDenied: true,
			wantMessage: "may write the status only of claims allocated on its own node",
			req:         admission{operation: "UPDATE", user: pluginUser, node: "node-a", oldObject: claim(t, ""), object: claim(t, "")},
		},
		{
			name: "dropping the pod from reservedFor", wantMatched: true, wantDenied: true,
			wantMessage: "the kyb DRA plugin may not change a claim's allocation or reservedFor",
			req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", oldObject: here,
				object: mutate(here, func(s map[string]any) { delete(s, "reservedFor") })},
		},
		{
			name: "deallocating the claim", wantMatched: true, wantDenied: true,
			wantMessage: "may not change a claim's allocation or reservedFor",
			req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", oldObject: here,
				object: mutate(here, func(s map[string]any) { delete(s, "allocation") })},
		},
		{
			name: "another driver's entry", wantMatched: true, wantDenied: true,
			wantMessage: "the kyb DRA plugin may change only the status.devices entries of driver gpu.kyb.ai",
			req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", oldObject: here,
				object: mutate(here, func(s map[string]any) { s["devices"] = []any{} })},
		},
		{
			name: "a token without a node", wantMatched: true, wantDenied: true,
			wantMessage: "token names no node",
			req:         admission{operation: "UPDATE", user: pluginUser, oldObject: here, object: withSeatStatus(t, here)},
		},
		{
			name: "the scheduler is not the policy's business",
			req: admission{operation: "UPDATE", user: "system:kube-scheduler", oldObject: claim(t, ""),
				object: here},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := evaluate(t, vap, tc.req)
			checkVerdict(t, got, tc.wantMatched, tc.wantDenied, tc.wantMessage)
		})
	}
}

// nodeEvent is an event about a Node, as the plugin records it.
func nodeEvent(t *testing.T, node string) map[string]any {
	return obj(t, fmt.Sprintf(`{metadata: {namespace: default, name: %s.1}, regarding: {kind: Node, apiVersion: v1, name: %s},
reportingController: gpu.kyb.ai, reportingInstance: gpu.kyb.ai-plugin-x, reason: GPUUnhealthy, type: Warning, note: GPU 0 lost}`, node, node))
}

// claimEvent is an event about a claim, recorded in namespace, naming
// node as related, as the plugin records it.
func claimEvent(t *testing.T, namespace, node string) map[string]any {
	return obj(t, fmt.Sprintf(`{metadata: {namespace: %s, name: c.1},
regarding: {kind: ResourceClaim, apiVersion: resource.k8s.io/v1, namespace: team-a, name: c, uid: u},
related: {kind: Node, apiVersion: v1, name: %s},
reportingController: gpu.kyb.ai, reportingInstance: gpu.kyb.ai-plugin-x, reason: Prepared, type: Normal, note: seat 0}`, namespace, node))
}

func TestEventPolicyKeepsEachPluginToItsOwnEvents(t *testing.T) {
	vap := policies(t)["events"]
	// with sets a field of an event; nil removes it.
	with := func(e map[string]any, key string, v any) map[string]any {
		if v == nil {
			delete(e, key)
			return e
		}
		e[key] = v
		return e
	}
	for _, tc := range []struct {
		name        string
		req         admission
		wantMatched bool
		wantDenied  bool
		wantMessage string
	}{
		{name: "its Node", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: nodeEvent(t, "node-a")}, wantMatched: true},
		{name: "a claim it prepares", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: claimEvent(t, "team-a", "node-a")}, wantMatched: true},
		{name: "a series of its claim event", req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", object: claimEvent(t, "team-a", "node-a"), oldObject: claimEvent(t, "team-a", "node-a")}, wantMatched: true},
		{
			name: "another Node", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: nodeEvent(t, "node-b")},
			wantMatched: true, wantDenied: true, wantMessage: `the kyb DRA plugin on node node-a may record events only about its own Node, not about node "node-b"`,
		},
		{
			name: "a claim as another node", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: claimEvent(t, "team-a", "node-b")},
			wantMatched: true, wantDenied: true, wantMessage: `may record events about ResourceClaims only as their node, not as node "node-b"`,
		},
		{
			name: "a claim naming no node", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: with(claimEvent(t, "team-a", "node-a"), "related", nil)},
			wantMatched: true, wantDenied: true, wantMessage: `not as node ""`,
		},
		{
			name: "a claim's event in another namespace", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: claimEvent(t, "kube-system", "node-a")},
			wantMatched: true, wantDenied: true, wantMessage: "only in the claim's namespace",
		},
		{
			name: "a pod", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: with(claimEvent(t, "team-a", "node-a"), "regarding", map[string]any{"kind": "Pod", "namespace": "team-a", "name": "p"})},
			wantMatched: true, wantDenied: true, wantMessage: `only about its Node and ResourceClaims, not about a "Pod"`,
		},
		{
			name: "as another controller", req: admission{operation: "CREATE", user: pluginUser, node: "node-a", object: with(nodeEvent(t, "node-a"), "reportingController", "kubelet")},
			wantMatched: true, wantDenied: true, wantMessage: "only as controller gpu.kyb.ai",
		},
		{
			name: "take over another node's event", req: admission{operation: "UPDATE", user: pluginUser, node: "node-a", object: nodeEvent(t, "node-a"), oldObject: nodeEvent(t, "node-b")},
			wantMatched: true, wantDenied: true, wantMessage: `not about node "node-b"`,
		},
		{
			name: "a token without a node", req: admission{operation: "CREATE", user: pluginUser, object: nodeEvent(t, "node-a")},
			wantMatched: true, wantDenied: true, wantMessage: "the kyb DRA plugin's ServiceAccount token names no node",
		},
		{name: "another user is not the policy's business", req: admission{operation: "CREATE", user: "system:node:node-b", object: nodeEvent(t, "node-b")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkVerdict(t, evaluate(t, vap, tc.req), tc.wantMatched, tc.wantDenied, tc.wantMessage)
		})
	}
}
