module github.com/xseg-dev/xseg/examples/gorgonia

go 1.26.0

require github.com/xseg-dev/xseg v0.0.0

require (
	github.com/google/btree v1.1.3 // indirect
	github.com/google/uuid v1.1.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	golang.org/x/sys v0.49.0 // indirect
	gorgonia.org/cu v0.9.6 // indirect
)

replace github.com/xseg-dev/xseg => ../..
