package v1alpha1

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// FieldError is one problem found in a document, tied to the field path at
// fault (such as "profiles[1].seatsPerGroup").
type FieldError struct {
	// Path is the field path in the syntax of field.Path.String().
	Path string
	// Detail says what is wrong, in words a user can act on.
	Detail string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Detail
	}
	return e.Path + ": " + e.Detail
}

// FieldErrors is a list of problems, reported together so that a user can
// fix a document in one pass.
type FieldErrors []*FieldError

// Add appends a problem at path.
func (l *FieldErrors) Add(path *field.Path, format string, args ...any) {
	p := ""
	if path != nil {
		p = path.String()
	}
	*l = append(*l, &FieldError{Path: p, Detail: fmt.Sprintf(format, args...)})
}

// Err returns nil for an empty list, else the list as an error.
func (l FieldErrors) Err() error {
	if len(l) == 0 {
		return nil
	}
	return l
}

func (l FieldErrors) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}
