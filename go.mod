module github.com/xseg-dev/xseg

go 1.26.0

require (
	github.com/google/btree v1.1.3 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
