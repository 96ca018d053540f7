package layering

import (
	"bufio"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// pkg is what the test knows of one package directory: the module's
// packages each of its files imports, over every build variant (files
// excluded by build constraints are read too).
type pkg struct {
	rel        string   // directory relative to the module root, "." for the root
	imports    []string // module-relative paths imported by non-test files ("." is the root)
	allImports []string // the same, test files included
	cgoFiles   []string // Go files that import "C", and C, C++, Objective-C or Fortran sources
	goFiles    int      // a directory without Go files is no package: its C sources are not built
}

// cSuffixes name the source files the go command compiles only with cgo.
var cSuffixes = []string{".c", ".cc", ".cpp", ".cxx", ".m", ".f", ".F", ".for", ".f90"}

// cgoAllowed are the only packages that may use cgo (STYLE habit 1).
var cgoAllowed = []string{"vmm/cuda", "cmd/libxseg"}

// rule is one import arrow of DESIGN.md's diagram.
type rule struct {
	name    string
	applies func(rel string) bool
	// tests: the rule covers test files too.
	tests bool
	// allowed reports whether an import (module-relative) is permitted.
	allowed func(imp string) bool
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

var rules = []rule{
	{
		name:    "vmm imports nothing of the module",
		applies: func(rel string) bool { return rel == "vmm" },
		allowed: func(string) bool { return false },
	},
	{
		name:    "vmm/host and vmm/cuda import only vmm and vmm/internal",
		applies: func(rel string) bool { return under(rel, "vmm/host") || under(rel, "vmm/cuda") },
		allowed: func(imp string) bool { return imp == "vmm" || under(imp, "vmm/internal") },
	},
	{
		name:    "packages under vmm import only packages under vmm",
		applies: func(rel string) bool { return under(rel, "vmm") },
		allowed: func(imp string) bool { return under(imp, "vmm") },
	},
	{
		name:    "nothing under vmm, tests included, imports the allocators, ipc, handles or the root",
		applies: func(rel string) bool { return under(rel, "vmm") },
		tests:   true,
		allowed: func(imp string) bool {
			return imp != "." && !slices.ContainsFunc([]string{"expandable", "fallback", "ipc", "handles", "internal/core"},
				func(d string) bool { return under(imp, d) })
		},
	},
	{
		name:    "spec, the public vocabulary, imports only vmm",
		applies: func(rel string) bool { return under(rel, "spec") },
		tests:   true,
		allowed: func(imp string) bool { return imp == "vmm" || imp == "spec" },
	},
	{
		name: "cmd, bench, examples and metrics, tests included, import nothing under internal",
		applies: func(rel string) bool {
			return slices.ContainsFunc([]string{"cmd", "bench", "examples", "metrics"}, func(d string) bool { return under(rel, d) })
		},
		tests:   true,
		allowed: func(imp string) bool { return !under(imp, "internal") },
	},
	{
		name:    "the library imports nothing of cmd, bench or examples",
		applies: func(rel string) bool { return !under(rel, "cmd") && !under(rel, "bench") && !under(rel, "examples") },
		allowed: func(imp string) bool { return !under(imp, "cmd") && !under(imp, "bench") && !under(imp, "examples") },
	},
}

// check returns every breach of the cgo rule and of rules in pkgs.
func check(pkgs []pkg) []string {
	var bad []string
	for _, p := range pkgs {
		if len(p.cgoFiles) > 0 && !slices.Contains(cgoAllowed, p.rel) {
			bad = append(bad, fmt.Sprintf("%s uses cgo (%s); only %v may", p.rel, strings.Join(p.cgoFiles, ", "), cgoAllowed))
		}
		for _, r := range rules {
			if !r.applies(p.rel) {
				continue
			}
			imps := p.imports
			if r.tests {
				imps = p.allImports
			}
			for _, imp := range imps {
				if !r.allowed(imp) {
					bad = append(bad, fmt.Sprintf("%s imports %s: %s", p.rel, imp, r.name))
				}
			}
		}
	}
	return bad
}

func TestLayering(t *testing.T) {
	root, mod := moduleRoot(t)
	pkgs := scan(t, root, mod)
	rels := make([]string, 0, len(pkgs))
	for _, p := range pkgs {
		rels = append(rels, p.rel)
	}
	// The scan must see the packages it guards, or the test proves nothing.
	for _, want := range []string{".", "vmm", "spec", "internal/layering", "cmd/xseg", "cmd/libxseg", "metrics", "bench/trace", "examples/sharing"} {
		require.Contains(t, rels, want, "the scan missed a package")
	}
	// And it must see the cgo that vmm/cuda is there for.
	i := slices.IndexFunc(pkgs, func(p pkg) bool { return p.rel == "vmm/cuda" })
	require.GreaterOrEqual(t, i, 0, "the scan missed vmm/cuda")
	require.NotEmpty(t, pkgs[i].cgoFiles, "the scan found no cgo in vmm/cuda")
	require.Empty(t, check(pkgs), "layering breaches")
}

// TestCheckCatches proves that check sees each kind of breach.
func TestCheckCatches(t *testing.T) {
	bad := check([]pkg{
		{rel: "vmm", imports: []string{"vmm/internal/ledger"}, allImports: []string{"vmm/internal/ledger"}},
		{rel: "vmm/host", imports: []string{"vmm", "vmm/vmmtest"}, allImports: []string{"vmm", "vmm/vmmtest"}},
		{rel: "vmm/vmmtest", imports: []string{"vmm"}, allImports: []string{"vmm", "expandable"}},
		{rel: "vmm/cuda", imports: []string{"vmm"}, allImports: []string{"vmm"}, cgoFiles: []string{"lib_cgo.go"}},
		{rel: "expandable", imports: []string{"internal/core", "bench/trace"}, allImports: []string{"internal/core"}, cgoFiles: []string{"x.go"}},
		{rel: "cmd/xseg", imports: []string{".", "bench/trace"}, allImports: []string{"."}},
		{rel: "cmd/libxseg", imports: []string{".", "spec"}, allImports: []string{".", "spec", "internal/core"}},
		{rel: "metrics", imports: []string{"spec", "internal/core"}, allImports: []string{"spec", "internal/core"}},
		{rel: "spec", imports: []string{"vmm", "handles"}, allImports: []string{"vmm", "handles"}},
	})
	require.ElementsMatch(t, []string{
		"vmm imports vmm/internal/ledger: vmm imports nothing of the module",
		"vmm/host imports vmm/vmmtest: vmm/host and vmm/cuda import only vmm and vmm/internal",
		"vmm/vmmtest imports expandable: nothing under vmm, tests included, imports the allocators, ipc, handles or the root",
		"expandable uses cgo (x.go); only [vmm/cuda cmd/libxseg] may",
		"expandable imports bench/trace: the library imports nothing of cmd, bench or examples",
		"cmd/libxseg imports internal/core: cmd, bench, examples and metrics, tests included, import nothing under internal",
		"metrics imports internal/core: cmd, bench, examples and metrics, tests included, import nothing under internal",
		"spec imports handles: spec, the public vocabulary, imports only vmm",
	}, bad)
}

// moduleRoot finds go.mod above the working directory and reads the
// module path.
func moduleRoot(t *testing.T) (root, mod string) {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		f, err := os.Open(filepath.Join(dir, "go.mod"))
		if err == nil {
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(m), `"`)
				}
			}
			t.Fatalf("no module line in %s/go.mod", dir)
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no go.mod above the test")
		dir = parent
	}
}

// scan reads the imports of every Go file of the module, and notes its C
// sources, skipping testdata, hidden and underscore directories and nested
// modules, as the go command does. Directories without Go files (Python
// helpers, say) are left out.
func scan(t *testing.T, root, mod string) []pkg {
	byDir := map[string]*pkg{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "vendor" ||
				fileExists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		isC := slices.Contains(cSuffixes, filepath.Ext(name))
		if (!strings.HasSuffix(name, ".go") && !isC) || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		p := byDir[rel]
		if p == nil {
			p = &pkg{rel: rel}
			byDir[rel] = p
		}
		if isC {
			p.cgoFiles = append(p.cgoFiles, name)
			return nil
		}
		return addFile(fset, path, mod, p)
	})
	require.NoError(t, err)
	pkgs := make([]pkg, 0, len(byDir))
	for _, p := range byDir {
		if p.goFiles == 0 {
			continue
		}
		slices.Sort(p.imports)
		p.imports = slices.Compact(p.imports)
		slices.Sort(p.allImports)
		p.allImports = slices.Compact(p.allImports)
		pkgs = append(pkgs, *p)
	}
	return pkgs
}

// addFile records the imports of one file in p.
func addFile(fset *token.FileSet, path, mod string, p *pkg) error {
	f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
	if err != nil {
		return err
	}
	p.goFiles++
	test := strings.HasSuffix(path, "_test.go")
	for _, is := range f.Imports {
		imp, err := strconv.Unquote(is.Path.Value)
		if err != nil {
			return err
		}
		if imp == "C" {
			p.cgoFiles = append(p.cgoFiles, filepath.Base(path))
			continue
		}
		var rel string
		switch {
		case imp == mod:
			rel = "."
		case strings.HasPrefix(imp, mod+"/"):
			rel = strings.TrimPrefix(imp, mod+"/")
		default:
			continue
		}
		p.allImports = append(p.allImports, rel)
		if !test {
			p.imports = append(p.imports, rel)
		}
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestScan runs the scan over a small module made for it.
func TestScan(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		path := filepath.Join(root, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	}
	write("go.mod", "module example.com/m\n")
	write("m.go", "package m\n")
	write("a/a.go", "//go:build never\n\npackage a\n\nimport \"C\"\nimport _ \"example.com/m/b\"\n")
	write("a/a_test.go", "package a\n\nimport _ \"example.com/m\"\nimport _ \"fmt\"\n")
	write("b/b.go", "package b\n")
	write("b/b.c", "int x;\n")
	write("py/tool.c", "int y;\n")
	write("a/testdata/t.go", "package t\n\nimport \"C\"\n")
	write(".hidden/h.go", "package h\n\nimport \"C\"\n")
	write("nested/go.mod", "module example.com/n\n")
	write("nested/n.go", "package n\n\nimport \"C\"\n")

	t.Chdir(filepath.Join(root, "a"))
	gotRoot, mod := moduleRoot(t)
	require.Equal(t, root, gotRoot)
	require.Equal(t, "example.com/m", mod)
	pkgs := scan(t, root, mod)
	slices.SortFunc(pkgs, func(x, y pkg) int { return strings.Compare(x.rel, y.rel) })
	require.Equal(t, []pkg{
		{rel: ".", goFiles: 1},
		{rel: "a", imports: []string{"b"}, allImports: []string{".", "b"}, cgoFiles: []string{"a.go"}, goFiles: 2},
		{rel: "b", cgoFiles: []string{"b.c"}, goFiles: 1},
	}, pkgs)
}
