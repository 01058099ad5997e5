package podresources_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// A surface that starts before the kubelet serves PodResources waits for
// it; an answer other than "not served" is final at once, and a kubelet
// that never serves it ends the wait with its own error.
func TestListWhenServedWaitsForTheKubelet(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "dial unix kubelet.sock: connect: no such file or directory")
	for _, tc := range []struct {
		name      string
		answers   []error
		within    time.Duration
		wantCalls int
		wantErr   string
	}{
		{name: "served at once", answers: []error{nil}, within: time.Second, wantCalls: 1},
		{name: "served after two refusals", answers: []error{unavailable, unavailable, nil}, within: 10 * time.Second, wantCalls: 3},
		{name: "another error is final", answers: []error{status.Error(codes.PermissionDenied, "denied"), nil}, within: 10 * time.Second, wantCalls: 1, wantErr: "denied"},
		{name: "never served", answers: nil, within: 500 * time.Millisecond, wantErr: "the kubelet did not serve its PodResources API within 500ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			list := func(context.Context) (podresources.Listing, error) {
				calls++
				if calls > len(tc.answers) {
					return podresources.Listing{}, unavailable
				}
				return podresources.Listing{}, tc.answers[calls-1]
			}
			_, err := podresources.ListWhenServed(context.Background(), tc.within, list)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
			if tc.wantCalls > 0 && calls != tc.wantCalls {
				t.Errorf("%d calls, want %d", calls, tc.wantCalls)
			}
			if tc.answers == nil && !errors.Is(err, unavailable) && status.Code(err) != codes.Unavailable {
				t.Errorf("error %v does not carry the kubelet's own answer", err)
			}
		})
	}
}
