// Package app is the kubectl-kyb command: a kubectl plugin whose `seats`
// subcommand shows, from the API alone, every kyb GPU group of the
// cluster's nodes with its seats, its state and who holds each seat.
package app

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
)

const usage = `Usage: kubectl kyb seats [flags]

Shows every GPU group of the kyb driver (gpu.kyb.ai) on each node: its
profile, GPUs, seats and how many are held, its state (free, in use, full,
blocked by which group, unhealthy) and, per held seat, the claim and its
pods; then the free seats per profile across the nodes shown, and each
node's fragmentation: its free GPUs, and how many of them are outside
every free group of its largest size (which a request of that size cannot
use), with the nodes' total. A sized profile's group shows its memory
(per GPU) and compute held of what it publishes, each holder its size,
and a table the memory and compute free per sized profile. It reads
ResourceSlices and ResourceClaims from the API server and needs no access
to the nodes. Install: put kubectl-kyb on your PATH.

  kubectl kyb seats -A
  kubectl kyb seats --node gpu-node-7 -o wide
  kubectl kyb seats -A -o json | jq '.free'
  kubectl kyb seats -A -o json | jq '.sizes'

Seats held by claims of other namespaces than -n count in HELD but are
not named; -A names every holder. A seat's number appears once the plugin
has written the claim's status, about a second after its prepare ("?"
until then). A node whose driver is publishing its ResourceSlices anew
shows a NOTE instead of its groups until all of them are listed: the
scheduler allocates nothing there meanwhile. Characters that are not
printable are escaped in the table (\n, \t, \x1b ...); -o json gives the
text exactly.

Flags:
`

// options are the command's flags.
type options struct {
	kubeconfig    string
	context       string
	namespace     string
	allNamespaces bool
	node          string
	output        *cli.OneOf
	timeout       time.Duration
}

// Run runs kubectl-kyb and returns its exit code.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "seats" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			_, _ = fmt.Fprint(stdout, usage)
			return cli.ExitOK
		}
		_, _ = fmt.Fprintf(stderr, "kubectl-kyb: the subcommand is seats (kubectl kyb seats -h)\n")
		return cli.ExitUsage
	}
	f := cli.NewFlagSet("kubectl kyb seats", stderr)
	var o options
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "", "kubeconfig file; default: $KUBECONFIG, then ~/.kube/config")
	f.StringVar(&o.context, "context", "", "", "kubeconfig context; default: the current one")
	f.StringVar(&o.namespace, "namespace", "", "", "name the holders of this namespace; default: the context's")
	f.StringVar(&o.namespace, "n", "", "", "same as --namespace")
	f.BoolVar(&o.allNamespaces, "all-namespaces", "", false, "name the holders of every namespace")
	f.BoolVar(&o.allNamespaces, "A", "", false, "same as --all-namespaces")
	f.StringVar(&o.node, "node", "", "", "show this node alone")
	o.output = cli.NewOneOf("table", "table", "wide", "json")
	f.Var(o.output, "o", "", "output format: table, wide or json")
	f.Var(o.output, "output", "", "same as -o")
	f.DurationVar(&o.timeout, "request-timeout", "", 30*time.Second, "how long to wait for the API server")
	if code, ok := f.ParseOrExit(args[1:], getenv, usage); !ok {
		return code
	}
	client, namespace, err := o.client(getenv)
	if err != nil {
		return f.Fail(cli.ExitFailed, err)
	}
	if o.namespace != "" {
		namespace = o.namespace
	}
	if o.allNamespaces {
		namespace = ""
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	v, err := Seats(ctx, client, o.node, namespace, stderr)
	if err != nil {
		return f.Fail(cli.ExitFailed, err)
	}
	if o.output.Value() == "json" {
		err = seatview.WriteJSON(stdout, v)
	} else {
		err = seatview.WriteTable(stdout, v, o.output.Value() == "wide")
	}
	if err != nil {
		return f.Fail(cli.ExitFailed, err)
	}
	return cli.ExitOK
}

// client builds the API client from the kubeconfig as kubectl would, and
// returns the context's namespace.
func (o *options) client(getenv func(string) string) (kubernetes.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.Precedence = nil
	if env := getenv("KUBECONFIG"); env != "" {
		rules.Precedence = filepath.SplitList(env)
	}
	if home := getenv("HOME"); home != "" {
		rules.Precedence = append(rules.Precedence, filepath.Join(home, ".kube", "config"))
	}
	rules.ExplicitPath = o.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-kyb"
	// One command, a few lists: no client-side throttling in the way.
	cfg.QPS, cfg.Burst = 50, 100
	namespace, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig namespace: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("create Kubernetes client: %w", err)
	}
	return client, namespace, nil
}

// pageSize is the page of each list: large lists arrive in pieces the API
// server can serve from its cache.
const pageSize = 500

// Seats reads the driver's ResourceSlices (of node, or every node) and the
// ResourceClaims, and builds the view; namespace "" names every holder.
// The states need every claim: where listing them cluster-wide is
// forbidden, it lists namespace's alone and says on warnings that the
// counts cover that namespace only.
func Seats(ctx context.Context, client kubernetes.Interface, node, namespace string, warnings io.Writer) (*seatview.View, error) {
	selector := fields.Set{"spec.driver": driver.Name}
	if node != "" {
		selector["spec.nodeName"] = node
	}
	var resourceSlices []resourceapi.ResourceSlice
	opts := metav1.ListOptions{FieldSelector: selector.String(), Limit: pageSize}
	for {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list ResourceSlices: %w", err)
		}
		resourceSlices = append(resourceSlices, list.Items...)
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}
	claims, err := listClaims(ctx, client, "")
	if apierrors.IsForbidden(err) && namespace != "" {
		_, _ = fmt.Fprintf(warnings, "kubectl-kyb: not allowed to list ResourceClaims of every namespace; held seats and states count namespace %s only\n", namespace)
		claims, err = listClaims(ctx, client, namespace)
	}
	if err != nil {
		return nil, err
	}
	return seatview.Build(resourceSlices, claims, seatview.Options{Node: node, Namespace: namespace}), nil
}

func listClaims(ctx context.Context, client kubernetes.Interface, namespace string) ([]resourceapi.ResourceClaim, error) {
	var out []resourceapi.ResourceClaim
	opts := metav1.ListOptions{Limit: pageSize}
	for {
		list, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, opts)
		if err != nil {
			where := "every namespace"
			if namespace != "" {
				where = "namespace " + namespace
			}
			return nil, fmt.Errorf("list ResourceClaims of %s: %w", where, err)
		}
		out = append(out, list.Items...)
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}
