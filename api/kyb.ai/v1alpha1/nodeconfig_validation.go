package v1alpha1

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	yamlv3 "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

const (
	// MaxGroupNameLength keeps device names (<group>-<profile>) within the
	// 63 characters of a DNS label.
	MaxGroupNameLength = 24
	// MaxProfileNameLength likewise.
	MaxProfileNameLength = 24
	// MaxSeatsPerGroup bounds the seats of one group. Seats are logical
	// shares of the same GPUs; beyond this many, a seat is no longer a
	// meaningful share, and the per-seat devices of the fallback layout
	// and the device-plugin shim grow with it.
	MaxSeatsPerGroup = 128
)

// ValidGroupSizes are the group sizes a profile may have.
var ValidGroupSizes = []int{1, 2, 4, 8}

var groupNameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$`)

// Validate checks everything that can be checked without knowing the node's
// GPUs. Call it before SetDefaults: it tells an explicit 0 from a field left
// out. Problems that need the node (a GPU index that does not exist) are the
// planner's to find.
func (c *NodeConfig) Validate() error {
	var errs FieldErrors
	if c.APIVersion != "" && c.APIVersion != APIVersion {
		errs.Add(field.NewPath("apiVersion"), "must be %q, not %q", APIVersion, c.APIVersion)
	}
	if c.Kind != "" && c.Kind != NodeConfigKind {
		errs.Add(field.NewPath("kind"), "must be %q, not %q", NodeConfigKind, c.Kind)
	}
	if c.Profiles != nil && len(c.Profiles) == 0 {
		errs.Add(field.NewPath("profiles"), "must list at least one profile; leave it out for the defaults (1x, 2x, 4x)")
	}
	names := map[string]int{}
	resources := map[string]int{}
	for i := range c.Profiles {
		p := c.Profiles[i]
		path := field.NewPath("profiles").Index(i)
		validateProfile(&p, path, &errs)
		p.SetDefaults()
		if j, dup := resources[p.Resource]; dup && p.Resource != "" {
			errs.Add(path.Child("resource"), "%q is already used by profiles[%d]", p.Resource, j)
		} else {
			resources[p.Resource] = i
		}
		if j, dup := names[p.Name]; dup && p.Name != "" {
			errs.Add(path.Child("name"), "profile name %q is already used by profiles[%d]; set a distinct name", p.Name, j)
		} else {
			names[p.Name] = i
		}
	}

	validateSharingTogether(c.Profiles, &errs)

	groupNames := map[string]int{}
	for i, g := range c.Groups {
		path := field.NewPath("groups").Index(i)
		switch {
		case g.Name == "":
			errs.Add(path.Child("name"), "required")
		case len(g.Name) > MaxGroupNameLength:
			errs.Add(path.Child("name"), "%q is longer than %d characters", g.Name, MaxGroupNameLength)
		case !groupNameRE.MatchString(g.Name):
			errs.Add(path.Child("name"), "%q must consist of letters, digits and '-', starting and ending with a letter or digit", g.Name)
		}
		if j, dup := groupNames[strings.ToLower(g.Name)]; dup && g.Name != "" {
			errs.Add(path.Child("name"), "group name %q is already used by groups[%d] (names are compared without case)", g.Name, j)
		} else {
			groupNames[strings.ToLower(g.Name)] = i
		}
		if len(g.GPUs) == 0 {
			errs.Add(path.Child("gpus"), "required: list the GPU indices of the group")
		} else if !slices.Contains(ValidGroupSizes, len(g.GPUs)) {
			errs.Add(path.Child("gpus"), "a group has 1, 2, 4 or 8 GPUs, not %d", len(g.GPUs))
		}
		validateIndices(g.GPUs, path.Child("gpus"), &errs)
	}

	switch c.Grouping {
	case "", GroupingAuto, GroupingExplicit:
	default:
		errs.Add(field.NewPath("grouping"), "must be %q or %q, not %q", GroupingAuto, GroupingExplicit, c.Grouping)
	}
	switch c.AllocationPolicy {
	case "", PolicyPack, PolicySpread:
	default:
		errs.Add(field.NewPath("allocationPolicy"), "must be %q or %q, not %q", PolicyPack, PolicySpread, c.AllocationPolicy)
	}
	switch c.UnavailableGroups {
	case "", UnavailableGroupsPublish, UnavailableGroupsHideBlocked, UnavailableGroupsHide:
	default:
		errs.Add(field.NewPath("unavailableGroups"), "must be %q or %q, not %q", UnavailableGroupsPublish, UnavailableGroupsHideBlocked, c.UnavailableGroups)
	}
	if c.Attributes != nil {
		validateAttributes(c.Attributes, field.NewPath("attributes"), &errs)
	}
	if c.Health != nil {
		validateHealth(c.Health, field.NewPath("health"), &errs)
	}
	return errs.Err()
}

func validateProfile(p *Profile, path *field.Path, errs *FieldErrors) {
	if p.Resource == "" {
		errs.Add(path.Child("resource"), "required, such as kyb.ai/gpu-1x-seat")
	} else {
		if msgs := validation.IsQualifiedName(p.Resource); len(msgs) > 0 || !strings.Contains(p.Resource, "/") {
			errs.Add(path.Child("resource"), "%q is not an extended resource name (<domain>/<name>, such as kyb.ai/gpu-1x-seat)", p.Resource)
		} else if domain := p.Resource[:strings.IndexByte(p.Resource, '/')]; domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
			errs.Add(path.Child("resource"), "%q: the kubernetes.io domain is reserved for Kubernetes", p.Resource)
		}
	}
	name := p.Name
	if name == "" {
		name = p.defaultName()
	}
	if p.Resource != "" || p.Name != "" {
		namePath := path.Child("name")
		switch {
		case len(name) > MaxProfileNameLength:
			errs.Add(namePath, "%q is longer than %d characters", name, MaxProfileNameLength)
		case len(validation.IsDNS1123Label(name)) > 0:
			if p.Name == "" {
				errs.Add(namePath, "the name derived from the resource, %q, is not a DNS label (lower-case letters, digits, '-'); set name", name)
			} else {
				errs.Add(namePath, "%q must be a DNS label: lower-case letters, digits and '-'", name)
			}
		}
	}
	switch {
	case p.IsMIG():
		validateMIG(p, path, errs)
	case p.GPUsPerGroup != nil:
		if !slices.Contains(ValidGroupSizes, *p.GPUsPerGroup) {
			errs.Add(path.Child("gpusPerGroup"), "must be 1, 2, 4 or 8, not %d", *p.GPUsPerGroup)
		} else if n := SizeFromResource(p.Resource); n > 0 && n != *p.GPUsPerGroup {
			errs.Add(path.Child("gpusPerGroup"), "%d contradicts the resource name %q, which says %d", *p.GPUsPerGroup, p.Resource, n)
		}
	case p.Resource != "":
		if n := SizeFromResource(p.Resource); n == 0 {
			errs.Add(path.Child("gpusPerGroup"), "required: the resource name %q does not carry the group size (as in gpu-2x-seat)", p.Resource)
		} else if !slices.Contains(ValidGroupSizes, n) {
			errs.Add(path.Child("resource"), "%q names groups of %d GPUs; a group has 1, 2, 4 or 8", p.Resource, n)
		}
	}
	if p.SeatsPerGroup != nil && !p.IsMIG() {
		switch s := *p.SeatsPerGroup; {
		case s < 1:
			errs.Add(path.Child("seatsPerGroup"), "must be at least 1, not %d", s)
		case s > MaxSeatsPerGroup:
			errs.Add(path.Child("seatsPerGroup"), "must be at most %d, not %d", MaxSeatsPerGroup, s)
		}
	}
	validateIndices(p.GPUs, path.Child("gpus"), errs)
	if !p.IsMIG() {
		validateSharing(p, path, errs)
	}
}

func validateIndices(indices []int, path *field.Path, errs *FieldErrors) {
	seen := map[int]int{}
	for j, idx := range indices {
		if idx < 0 {
			errs.Add(path.Index(j), "GPU index must not be negative, not %d", idx)
			continue
		}
		if k, dup := seen[idx]; dup {
			errs.Add(path.Index(j), "GPU %d is listed twice (also at [%d])", idx, k)
		}
		seen[idx] = j
	}
}

func validateAttributes(attrs []AttributeName, path *field.Path, errs *FieldErrors) {
	seen := map[AttributeName]bool{}
	for i, a := range attrs {
		if !slices.Contains(KnownAttributes, a) {
			names := make([]string, len(KnownAttributes))
			for k, n := range KnownAttributes {
				names[k] = string(n)
			}
			errs.Add(path.Index(i), "unknown attribute %q; known: %s", a, strings.Join(names, ", "))
		}
		if seen[a] {
			errs.Add(path.Index(i), "attribute %q is listed twice", a)
		}
		seen[a] = true
	}
	if !seen[AttrProfile] {
		errs.Add(path, "must include %q: the DeviceClasses select devices by it", AttrProfile)
	}
}

func validateHealth(h *HealthConfig, path *field.Path, errs *FieldErrors) {
	for i, x := range h.IgnoredXIDs {
		if x <= 0 {
			errs.Add(path.Child("ignoredXIDs").Index(i), "an XID is a positive number, not %d", x)
		}
	}
	for i, x := range h.CriticalXIDs {
		if x <= 0 {
			errs.Add(path.Child("criticalXIDs").Index(i), "an XID is a positive number, not %d", x)
		}
		if slices.Contains(h.IgnoredXIDs, x) {
			errs.Add(path.Child("criticalXIDs").Index(i), "XID %d is also in ignoredXIDs; list it in one of them", x)
		}
	}
	if h.RecoveryPeriod != nil && h.RecoveryPeriod.Duration < time.Second {
		errs.Add(path.Child("recoveryPeriod"), "must be at least 1s, not %s", h.RecoveryPeriod.Duration)
	}
	switch h.GPULostEffect {
	case "", "NoSchedule", "NoExecute":
	default:
		errs.Add(path.Child("gpuLostEffect"), "must be NoSchedule or NoExecute, not %q", h.GPULostEffect)
	}
}

// LoadNodeConfig decodes, validates and defaults a node configuration.
// data may also be a whole ConfigMap manifest holding the configuration
// under data."config.yaml" (as the chart and the seat design write it). The
// Source maps field paths to lines for errors found later by the planner.
func LoadNodeConfig(data []byte, name string) (*NodeConfig, *Source, error) {
	payload, offset, notes, err := configMapPayload(data, name)
	if err != nil {
		return nil, nil, err
	}
	if payload != nil {
		data = payload
	}
	cfg := &NodeConfig{}
	src, strictErrs, err := decodeStrict(data, name, cfg)
	if src != nil {
		src.offset = offset
		src.Notes = append(notes, src.Notes...)
	}
	if err != nil {
		return nil, src, err
	}
	var errs FieldErrors
	errs = append(errs, strictErrs...)
	if verr := cfg.Validate(); verr != nil {
		errs = append(errs, verr.(FieldErrors)...)
	}
	if len(errs) > 0 {
		return nil, src, src.Annotate(errs)
	}
	if cfg.UnavailableGroups == UnavailableGroupsHide {
		src.Notes = append(src.Notes, fmt.Sprintf("%s:%d: unavailableGroups: hide is read as hideBlocked: groups in use, full ones included, are always published now (the default, publish, publishes every group)", src.Name, src.Line("unavailableGroups")))
	}
	cfg.SetDefaults()
	return cfg, src, nil
}

// configMapPayload recognises a ConfigMap manifest and returns the
// configuration it carries and the line the payload starts after; nil
// payload when data is not a ConfigMap.
func configMapPayload(data []byte, name string) ([]byte, int, []string, error) {
	src := &Source{Name: name}
	root, _, err := parseYAML(data, src)
	if err != nil || root == nil || root.Kind != yamlv3.MappingNode {
		return nil, 0, nil, nil // decodeStrict reports it
	}
	var kind, apiVersion string
	var dataNode *yamlv3.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch root.Content[i].Value {
		case "kind":
			kind = root.Content[i+1].Value
		case "apiVersion":
			apiVersion = root.Content[i+1].Value
		case "data":
			dataNode = root.Content[i+1]
		}
	}
	if kind != "ConfigMap" || apiVersion != "v1" {
		return nil, 0, nil, nil
	}
	if dataNode == nil || len(dataNode.Content) == 0 {
		return nil, 0, nil, fmt.Errorf("%s: the ConfigMap has no data; put the node configuration under data.\"config.yaml\"", name)
	}
	var keys []string
	for i := 0; i+1 < len(dataNode.Content); i += 2 {
		key, val := dataNode.Content[i], dataNode.Content[i+1]
		keys = append(keys, key.Value)
		if key.Value == "config.yaml" || len(dataNode.Content) == 2 {
			notes := append(slices.Clone(src.Notes), "read the configuration from the ConfigMap's data."+key.Value)
			return []byte(val.Value), val.Line, notes, nil
		}
	}
	return nil, 0, nil, fmt.Errorf("%s: the ConfigMap has keys %s but no \"config.yaml\"", name, strings.Join(keys, ", "))
}
