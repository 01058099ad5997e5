package doctor

import (
	"fmt"
	"strconv"
	"strings"
)

// tomlValues are the scalar and string-array keys of a TOML file, by
// "<table>.<key>" with the table's quotes removed:
// [plugins."io.containerd.grpc.v1.cri"] enable_cdi = true is
// plugins.io.containerd.grpc.v1.cri.enable_cdi. It reads what runtime
// configurations use for the settings the doctor looks at (tables, keys,
// booleans, integers, strings, arrays of strings, comments); anything else
// is skipped, not refused, so a setting the doctor does not read never
// stops it from reading the ones it does.
type tomlValues map[string]string

// parseTOML reads data. An error names the line of a value it cannot read.
func parseTOML(data string) (tomlValues, error) {
	out := tomlValues{}
	table := ""
	lines := strings.Split(data, "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(stripComment(lines[i]))
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "[") {
			table = unquoteKey(strings.Trim(line, "[] \t"))
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		start := i
		// An array may run over several lines.
		for strings.HasPrefix(value, "[") && !balanced(value) && i+1 < len(lines) {
			i++
			value += " " + strings.TrimSpace(stripComment(lines[i]))
		}
		if strings.HasPrefix(value, "[") && !balanced(value) {
			return nil, fmt.Errorf("line %d: array without its closing ]", start+1)
		}
		name := unquoteKey(strings.TrimSpace(key))
		if table != "" {
			name = table + "." + name
		}
		out[name] = value
	}
	return out, nil
}

// bool returns a boolean key; ok is false where it is unset.
func (v tomlValues) bool(key string) (value, ok bool, err error) {
	s, ok := v[key]
	if !ok {
		return false, false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, true, fmt.Errorf("%s = %s is not a boolean", key, s)
	}
	return b, true, nil
}

// int returns an integer key, def where it is unset.
func (v tomlValues) int(key string, def int) int {
	n, err := strconv.Atoi(v[key])
	if err != nil {
		return def
	}
	return n
}

// strings returns an array of strings; ok is false where it is unset.
func (v tomlValues) strings(key string) (values []string, ok bool) {
	s, ok := v[key]
	if !ok {
		return nil, false
	}
	s = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			values = append(values, strings.Trim(item, `"'`))
		}
	}
	return values, true
}

// stripComment drops a # comment that is not inside a string.
func stripComment(line string) string {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote == 0 && (r == '"' || r == '\''):
			quote = r
		case quote == 0 && r == '#':
			return line[:i]
		}
	}
	return line
}

func balanced(s string) bool {
	return strings.Count(s, "[") == strings.Count(s, "]")
}

func unquoteKey(k string) string {
	k = strings.ReplaceAll(k, `"`, "")
	k = strings.ReplaceAll(k, "'", "")
	return strings.ReplaceAll(k, " ", "")
}
