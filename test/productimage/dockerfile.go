package productimage

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Recipe is what the Dockerfile says about the image, as the OCI build
// needs it: the build stage's go build and the runtime stage's files and
// configuration.
type Recipe struct {
	// Base is the runtime stage's base image, which the OCI build
	// replaces with Debian's packages.
	Base string
	// BuildEnv is the build stage's ARGs: RUN sees them as environment
	// variables, as Docker gives them.
	BuildEnv map[string]string
	// BuildCommand is the build stage's RUN line that runs go build, as
	// /bin/sh -c runs it; BuildLine is where it is.
	BuildCommand string
	BuildLine    int
	// OutDir is where the build stage puts the binaries (the runtime
	// stage's COPY --from source), BinDir where the image has them.
	OutDir, BinDir string
	Labels         map[string]string
	User           string
	Entrypoint     []string
	Env            []string
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line int
	cmd  string // upper case
	args string
}

// ReadDockerfile reads the recipe from a Dockerfile, with build arguments
// as `docker build --build-arg` gives them.
func ReadDockerfile(file string, buildArgs map[string]string) (Recipe, error) {
	f, err := os.Open(file)
	if err != nil {
		return Recipe{}, err
	}
	defer func() { _ = f.Close() }()
	r, err := ParseDockerfile(f, buildArgs)
	if err != nil {
		return Recipe{}, fmt.Errorf("%s: %w", file, err)
	}
	return r, nil
}

// ParseDockerfile reads the recipe of a two-stage Dockerfile: a stage that
// builds the binaries with one RUN ... go build, and a last stage that
// copies them from it onto a base. The last stage may hold only what the
// OCI build reproduces (ARG, LABEL, USER, ENTRYPOINT in exec form, ENV and
// that COPY): anything else is an error, so that the two builds cannot
// drift apart unnoticed.
func ParseDockerfile(r io.Reader, buildArgs map[string]string) (Recipe, error) {
	instrs, err := instructions(r)
	if err != nil {
		return Recipe{}, err
	}
	type stage struct {
		name, base string
		args       map[string]string
		instrs     []instruction
	}
	global := map[string]string{}
	var stages []*stage
	for _, in := range instrs {
		var cur *stage
		if len(stages) > 0 {
			cur = stages[len(stages)-1]
		}
		switch {
		case in.cmd == "FROM":
			words := strings.Fields(in.args)
			var flagsSeen int
			for flagsSeen < len(words) && strings.HasPrefix(words[flagsSeen], "--") {
				flagsSeen++
			}
			words = words[flagsSeen:]
			s := &stage{args: map[string]string{}}
			switch {
			case len(words) == 1:
			case len(words) == 3 && strings.EqualFold(words[1], "AS"):
				s.name = words[2]
			default:
				return Recipe{}, fmt.Errorf("line %d: FROM %s: want FROM image [AS name]", in.line, in.args)
			}
			s.base = expand(words[0], global)
			stages = append(stages, s)
		case in.cmd == "ARG":
			name, def, hasDef := strings.Cut(in.args, "=")
			name = strings.TrimSpace(name)
			if strings.ContainsAny(name, " \t") {
				return Recipe{}, fmt.Errorf("line %d: ARG %s: one argument per ARG, please", in.line, in.args)
			}
			scope := global
			if cur != nil {
				scope = cur.args
			}
			words, err := shellWords(def, scope)
			if err != nil || len(words) > 1 {
				return Recipe{}, fmt.Errorf("line %d: ARG %s: the default is not one word", in.line, in.args)
			}
			value, ok := buildArgs[name]
			switch {
			case ok:
			case hasDef && len(words) == 1:
				value = words[0]
			case cur != nil:
				value = global[name]
			}
			if cur == nil {
				global[name] = value
			} else {
				cur.args[name] = value
			}
		case cur == nil:
			return Recipe{}, fmt.Errorf("line %d: %s before the first FROM", in.line, in.cmd)
		default:
			cur.instrs = append(cur.instrs, in)
		}
	}
	if len(stages) < 2 {
		return Recipe{}, fmt.Errorf("%d stages; want a build stage and a runtime stage", len(stages))
	}
	rt := stages[len(stages)-1]
	recipe := Recipe{Base: rt.base, Labels: map[string]string{}}
	var from string
	for _, in := range rt.instrs {
		switch in.cmd {
		case "LABEL", "ENV":
			words, err := shellWords(in.args, rt.args)
			if err != nil {
				return Recipe{}, fmt.Errorf("line %d: %s: %w", in.line, in.cmd, err)
			}
			for _, w := range words {
				k, v, ok := strings.Cut(w, "=")
				if !ok || k == "" {
					return Recipe{}, fmt.Errorf("line %d: %s %q: want key=value pairs", in.line, in.cmd, w)
				}
				if in.cmd == "LABEL" {
					recipe.Labels[k] = v
				} else {
					recipe.Env = append(recipe.Env, k+"="+v)
				}
			}
		case "USER":
			recipe.User = expand(strings.TrimSpace(in.args), rt.args)
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &recipe.Entrypoint); err != nil || len(recipe.Entrypoint) == 0 {
				return Recipe{}, fmt.Errorf("line %d: ENTRYPOINT %s: want the exec form [\"program\", ...]: the image has no shell", in.line, in.args)
			}
		case "COPY":
			words := strings.Fields(in.args)
			if len(words) != 3 || !strings.HasPrefix(words[0], "--from=") || from != "" {
				return Recipe{}, fmt.Errorf("line %d: COPY %s: the runtime stage may copy once, from the build stage: COPY --from=build /out/ /dir/", in.line, in.args)
			}
			from, recipe.OutDir, recipe.BinDir = strings.TrimPrefix(words[0], "--from="), words[1], words[2]
			if !strings.HasPrefix(recipe.OutDir, "/") || !strings.HasSuffix(recipe.OutDir, "/") || !strings.HasPrefix(recipe.BinDir, "/") {
				return Recipe{}, fmt.Errorf("line %d: COPY %s: want absolute directories, the source ending in /", in.line, in.args)
			}
		default:
			return Recipe{}, fmt.Errorf("line %d: %s in the runtime stage: the OCI build (test/productimage) does not reproduce it; teach it there", in.line, in.cmd)
		}
	}
	if from == "" {
		return Recipe{}, fmt.Errorf("the runtime stage copies nothing from a build stage")
	}
	var build *stage
	for _, s := range stages[:len(stages)-1] {
		if s.name == from {
			build = s
		}
	}
	if build == nil {
		return Recipe{}, fmt.Errorf("the runtime stage copies from %q, which is no earlier stage", from)
	}
	recipe.BuildEnv = build.args
	for _, in := range build.instrs {
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		if recipe.BuildCommand != "" {
			return Recipe{}, fmt.Errorf("line %d: a second RUN ... go build in stage %s (the first at line %d)", in.line, from, recipe.BuildLine)
		}
		if strings.HasPrefix(strings.TrimSpace(in.args), "[") || strings.HasPrefix(in.args, "--") {
			return Recipe{}, fmt.Errorf("line %d: RUN %s: want the shell form without flags", in.line, in.args)
		}
		recipe.BuildCommand, recipe.BuildLine = in.args, in.line
	}
	if recipe.BuildCommand == "" {
		return Recipe{}, fmt.Errorf("stage %s has no RUN ... go build", from)
	}
	if !strings.Contains(recipe.BuildCommand, recipe.OutDir) {
		return Recipe{}, fmt.Errorf("line %d: the go build does not write into %s, which the runtime stage copies", recipe.BuildLine, recipe.OutDir)
	}
	return recipe, nil
}

// instructions splits a Dockerfile into instructions: comments dropped,
// lines ending in a backslash joined with the next.
func instructions(r io.Reader) ([]instruction, error) {
	var out []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if body, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("line %d: the last instruction ends in a backslash", start)
	}
	return out, nil
}

// shellWords splits s into words as Docker does for LABEL, ENV and ARG:
// whitespace separates, quotes group, a backslash escapes, and $NAME or
// ${NAME} expands outside single quotes.
func shellWords(s string, vars map[string]string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("%q: unterminated '", s)
			}
			w.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				switch {
				case s[i] == '\\' && i+1 < len(s):
					i++
					w.WriteByte(s[i])
				case s[i] == '$':
					i += expandAt(s[i:], vars, &w) - 1
				default:
					w.WriteByte(s[i])
				}
			}
			if i >= len(s) {
				return nil, fmt.Errorf("%q: unterminated \"", s)
			}
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		case c == '$':
			i += expandAt(s[i:], vars, &w) - 1
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// expandAt expands the variable reference at the start of s ($NAME or
// ${NAME}; an unset one is empty, as in Docker) into w and returns how many
// bytes it took.
func expandAt(s string, vars map[string]string, w *strings.Builder) int {
	if strings.HasPrefix(s, "${") {
		if end := strings.IndexByte(s, '}'); end > 0 {
			w.WriteString(vars[s[2:end]])
			return end + 1
		}
	}
	n := 1
	for n < len(s) && (s[n] == '_' || s[n] >= 'A' && s[n] <= 'Z' || s[n] >= 'a' && s[n] <= 'z' || n > 1 && s[n] >= '0' && s[n] <= '9') {
		n++
	}
	if n == 1 {
		w.WriteByte('$')
		return 1
	}
	w.WriteString(vars[s[1:n]])
	return n
}

// expand expands the variables of a single word.
func expand(s string, vars map[string]string) string {
	var w strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '$' {
			i += expandAt(s[i:], vars, &w) - 1
			continue
		}
		w.WriteByte(s[i])
	}
	return w.String()
}
