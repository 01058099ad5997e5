package miginstance

import (
	"context"
	"errors"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// Gone lists the made and adopted instances that are no longer whole on
// their GPU: someone destroyed them (or only their compute instance), or
// a GPU reset took them. Only those of claims are checked, or all where
// claims is empty. It changes nothing: what is left of such an instance
// is destroyed, and the record forgotten, by the claim's next prepare
// (which makes the instance again, Ensure), its unprepare (Destroy) or
// the next start (Reconcile). A record that cannot be checked is left
// out, its error joined to the one returned.
func (m *Manager) Gone(ctx context.Context, claims ...types.UID) ([]Record, error) {
	records, unlock, err := m.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var out []Record
	var errs []error
	for _, r := range records {
		if !r.Phase.Made() || len(claims) > 0 && !slices.Contains(claims, r.Claim) {
			continue
		}
		_, ok, err := m.isWhole(r)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !ok:
			out = append(out, r)
		}
	}
	return out, errors.Join(errs...)
}
