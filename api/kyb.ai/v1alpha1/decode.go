package v1alpha1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// MaxDocumentSize bounds the documents the decoder reads. Real ones are a
// few kilobytes.
const MaxDocumentSize = 1 << 20

// MaxExpandedSize bounds what a document may grow to once its aliases are
// expanded. go-yaml refuses nested alias bombs but not a flat one (an
// anchor of 100 KB repeated a thousand times), which would cost gigabytes
// to decode; a real configuration uses aliases, if at all, for a few
// repeated lines.
const MaxExpandedSize = 4 * MaxDocumentSize

// Source remembers where a decoded document came from, so that problems
// found after decoding (validation, planning) can still name the line at
// fault.
type Source struct {
	// Name is the file the document was read from, or a description.
	Name string
	// Notes are things the decoder did on the user's behalf that the user
	// should know, such as reading tab indentation as spaces.
	Notes []string

	lines  map[string]int
	offset int
}

// Line returns the line (1-based) on which the field at path starts. A path
// that is absent from the document (a required field left out) resolves to
// its closest present ancestor. 0 means unknown.
func (s *Source) Line(path string) int {
	if s == nil {
		return 0
	}
	for {
		if line, ok := s.lines[path]; ok {
			return line + s.offset
		}
		if path == "" {
			return 0
		}
		path = parentPath(path)
	}
}

// Annotate prefixes every problem in err with the document's name and the
// line of the field at fault: "node-config.yaml:12: profiles[1].seatsPerGroup: must be at least 1".
func (s *Source) Annotate(err error) error {
	if err == nil || s == nil {
		return err
	}
	var list FieldErrors
	if !errors.As(err, &list) {
		var one *FieldError
		if !errors.As(err, &one) {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		list = FieldErrors{one}
	}
	msgs := make([]string, len(list))
	for i, fe := range list {
		prefix := s.Name
		if line := s.Line(fe.Path); line > 0 {
			prefix += ":" + strconv.Itoa(line)
		}
		msgs[i] = prefix + ": " + fe.Error()
	}
	return &annotatedError{msg: strings.Join(msgs, "\n"), list: list}
}

// annotatedError keeps the structured list reachable through errors.As while
// printing file and line.
type annotatedError struct {
	msg  string
	list FieldErrors
}

func (e *annotatedError) Error() string { return e.msg }
func (e *annotatedError) As(target any) bool {
	if t, ok := target.(*FieldErrors); ok {
		*t = e.list
		return true
	}
	return false
}

// parentPath strips the last element of a field path: "a[1].b" -> "a[1]" -> "a" -> "".
func parentPath(path string) string {
	if strings.HasSuffix(path, "]") {
		if i := strings.LastIndexByte(path, '['); i >= 0 {
			return path[:i]
		}
	}
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[:i]
	}
	return ""
}

// decodeStrict decodes one YAML (or JSON) document into out. Unknown and
// duplicate fields are returned as a FieldErrors list (the document was
// still decoded, so the caller can validate it and report everything in one
// pass); malformed YAML and values of the wrong type are returned as the
// error. The returned Source maps paths to lines.
func decodeStrict(data []byte, name string, out any) (*Source, FieldErrors, error) {
	src := &Source{Name: name}
	if len(data) > MaxDocumentSize {
		return src, nil, fmt.Errorf("%s: %d bytes; a document is at most %d", name, len(data), MaxDocumentSize)
	}
	root, data, err := parseYAML(data, src)
	if err != nil {
		return src, nil, err
	}
	if root == nil {
		return src, nil, fmt.Errorf("%s: the document is empty", name)
	}
	if err := checkExpansion(root); err != nil {
		return src, nil, fmt.Errorf("%s: %w", name, err)
	}
	src.lines = map[string]int{}
	indexLines(root, "", src.lines)

	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return src, nil, fmt.Errorf("%s: %w", name, err)
	}
	// encoding/json reports a type mismatch with its byte offset, which
	// resolves to the exact field path; the strict decoder below does not.
	if err := json.Unmarshal(jsonData, out); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			path := pathAtOffset(jsonData, typeErr.Offset)
			// A type's own UnmarshalJSON (a duration, a quantity)
			// reports an offset into its value alone; its field path is
			// then the better guide, without list indices, which the
			// document's one field of that path gives back.
			if typeErr.Field != "" && withoutIndices(path) != typeErr.Field {
				path = src.onlyPath(typeErr.Field)
			}
			return src, nil, src.Annotate(FieldErrors{{Path: path, Detail: fmt.Sprintf("expected %s, got %s", typeName(typeErr.Type), valueName(typeErr.Value))}})
		}
		return src, nil, fmt.Errorf("%s: %w", name, err)
	}
	strictErrs, err := sigsjson.UnmarshalStrict(jsonData, out)
	if err != nil {
		return src, nil, fmt.Errorf("%s: %w", name, err)
	}
	var list FieldErrors
	if len(strictErrs) > 0 {
		for _, se := range strictErrs {
			fe := &FieldError{Detail: se.Error()}
			if withPath, ok := se.(interface{ FieldPath() string }); ok {
				fe.Path = withPath.FieldPath()
				fe.Detail = strings.TrimSuffix(se.Error(), " "+strconv.Quote(fe.Path))
				if fe.Detail == "unknown field" {
					fe.Detail = "unknown field (check the spelling; fields are case-sensitive)"
				}
			}
			list = append(list, fe)
		}
	}
	return src, list, nil
}

// parseYAML parses data into a node tree. YAML forbids tabs in indentation,
// but configuration pasted from documents often carries them (the seat
// design's own ConfigMap example does): when a document fails to parse and
// has lines indented with tabs, it is read again with each leading tab as
// two spaces, and the returned data is that normalized text.
func parseYAML(data []byte, src *Source) (*yamlv3.Node, []byte, error) {
	root, err := parseNode(data)
	if err == nil {
		return root, data, nil
	}
	if fixed, changed := expandLeadingTabs(data); changed {
		if root2, err2 := parseNode(fixed); err2 == nil {
			src.Notes = append(src.Notes, "indentation with tabs was read as two spaces per tab")
			return root2, fixed, nil
		}
	}
	return nil, data, fmt.Errorf("%s: %w", src.Name, err)
}

func parseNode(data []byte) (*yamlv3.Node, error) {
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var doc yamlv3.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	var extra yamlv3.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fmt.Errorf("line %d: a second document starts here; give one document per file", extra.Line)
	}
	if doc.Kind == yamlv3.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0], nil
	}
	return nil, nil
}

func expandLeadingTabs(data []byte) ([]byte, bool) {
	lines := bytes.Split(data, []byte("\n"))
	changed := false
	for i, line := range lines {
		n := 0
		for n < len(line) && line[n] == '\t' {
			n++
		}
		if n > 0 {
			lines[i] = append(bytes.Repeat([]byte("  "), n), line[n:]...)
			changed = true
		}
	}
	return bytes.Join(lines, []byte("\n")), changed
}

// checkExpansion refuses a document that its aliases expand beyond
// MaxExpandedSize, before anything expands them. Sizes are counted as the
// JSON the document becomes (each scalar's text, a few bytes per node),
// with an anchor's size counted once and added at every alias of it.
func checkExpansion(root *yamlv3.Node) error {
	sizes := map[*yamlv3.Node]int64{}
	var size func(n *yamlv3.Node, depth int) (int64, error)
	size = func(n *yamlv3.Node, depth int) (int64, error) {
		if s, ok := sizes[n]; ok {
			if s < 0 {
				return 0, fmt.Errorf("line %d: alias *%s refers to itself", n.Line, n.Value)
			}
			return s, nil
		}
		if depth > 100 {
			return 0, fmt.Errorf("line %d: nested more than 100 deep", n.Line)
		}
		sizes[n] = -1
		total := int64(len(n.Value) + 4)
		if n.Kind == yamlv3.AliasNode && n.Alias != nil {
			s, err := size(n.Alias, depth+1)
			if err != nil {
				return 0, err
			}
			total = s
		}
		for _, c := range n.Content {
			s, err := size(c, depth+1)
			if err != nil {
				return 0, err
			}
			total += s
			if total > MaxExpandedSize {
				return 0, fmt.Errorf("line %d: once its aliases are expanded the document grows beyond %d MiB (every alias repeats its anchor's text); refusing to decode it", n.Line, MaxExpandedSize>>20)
			}
		}
		sizes[n] = total
		return total, nil
	}
	_, err := size(root, 0)
	return err
}

// indexLines records the line of every mapping value and sequence item under
// the field path syntax of field.Path.
func indexLines(n *yamlv3.Node, path string, lines map[string]int) {
	// An alias is not followed: nested aliases expand exponentially (the
	// "billion laughs" document), and its fields are on the anchor's lines.
	if _, ok := lines[path]; !ok {
		lines[path] = n.Line
	}
	switch n.Kind {
	case yamlv3.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, val := n.Content[i], n.Content[i+1]
			child := key.Value
			if path != "" {
				child = path + "." + key.Value
			}
			lines[child] = key.Line
			indexLines(val, child, lines)
		}
	case yamlv3.SequenceNode:
		for i, item := range n.Content {
			indexLines(item, path+"["+strconv.Itoa(i)+"]", lines)
		}
	}
}

// pathAtOffset walks a JSON document up to offset and returns the field path
// of the value being read there.
func pathAtOffset(data []byte, offset int64) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		array bool
		index int
		key   string
		// expectKey is true inside an object when the next string is a key.
		expectKey bool
	}
	var stack []frame
	render := func() string {
		var b strings.Builder
		for _, f := range stack {
			if f.array {
				fmt.Fprintf(&b, "[%d]", f.index-1)
			} else if f.key != "" {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(f.key)
			}
		}
		return b.String()
	}
	last := ""
	for {
		tok, err := dec.Token()
		if err != nil {
			return last
		}
		if dec.InputOffset() >= offset {
			// The token just read is the value at fault: in a list, it is
			// the next item, whose index the stack has not counted yet.
			if _, closing := tok.(json.Delim); len(stack) > 0 && stack[len(stack)-1].array &&
				(!closing || tok == json.Delim('{') || tok == json.Delim('[')) {
				stack[len(stack)-1].index++
			}
			return render()
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				if len(stack) > 0 && stack[len(stack)-1].array {
					stack[len(stack)-1].index++
				}
				stack = append(stack, frame{expectKey: true})
			case '[':
				if len(stack) > 0 && stack[len(stack)-1].array {
					stack[len(stack)-1].index++
				}
				stack = append(stack, frame{array: true})
			case '}', ']':
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && !stack[len(stack)-1].array {
					stack[len(stack)-1].expectKey = true
				}
			}
		default:
			if len(stack) == 0 {
				continue
			}
			top := &stack[len(stack)-1]
			switch {
			case top.array:
				top.index++
			case top.expectKey:
				top.key = fmt.Sprint(t)
				top.expectKey = false
			default:
				top.expectKey = true
			}
		}
		last = render()
	}
}

// onlyPath is the path of the document's one field whose path without
// list indices is field (a list's items are not fields); field itself
// where none or several are.
func (s *Source) onlyPath(field string) string {
	found := ""
	for p := range s.lines {
		if strings.HasSuffix(p, "]") || withoutIndices(p) != field {
			continue
		}
		if found != "" {
			return field
		}
		found = p
	}
	if found == "" {
		return field
	}
	return found
}

// withoutIndices drops the list indices of a field path: a[1].b -> a.b.
func withoutIndices(path string) string {
	var b strings.Builder
	skip := false
	for _, r := range path {
		switch {
		case r == '[':
			skip = true
		case r == ']':
			skip = false
		case !skip:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// typeName says what a Go type is in the words a YAML author uses.
func typeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	default:
		return "a mapping"
	}
}

// valueName says what encoding/json found, in the same words.
func valueName(v string) string {
	switch v {
	case "object":
		return "a mapping"
	case "array":
		return "a list"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	}
	if strings.HasPrefix(v, "number") {
		return "a number"
	}
	return v
}
