// Command vectorstore is an HTTP service that appends float32 vectors to
// one growable xseg buffer (GPU memory when CUDA is there, host memory
// otherwise) and serves its statistics and Prometheus metrics. See
// README.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/xseg-dev/xseg"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "address to serve on")
	dim := flag.Int("dim", 768, "values per vector")
	maxGiB := flag.Uint64("max-gib", 16, "the buffer's maximum size in GiB (address space only)")
	var backend xseg.Backend
	flag.TextVar(&backend, "backend", xseg.BackendAuto, "auto (CUDA if it opens, else host), cuda or host")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := serve(*addr, backend, *dim, *maxGiB<<30, log); err != nil {
		log.Error("vectorstore", "err", err)
		os.Exit(1)
	}
}

func serve(addr string, backend xseg.Backend, dim int, maxBytes uint64, log *slog.Logger) error {
	if dim <= 0 {
		return fmt.Errorf("-dim %d: want at least 1", dim)
	}
	d, err := xseg.OpenDriver(backend, 0)
	if err != nil {
		return err
	}
	s, err := newStore(d, dim, maxBytes)
	if err != nil {
		return errors.Join(err, d.Close())
	}
	log.Info("serving", "addr", addr, "backend", d.Backend(), "dim", dim, "max_bytes", s.buf.Max(), "address", s.buf.Ptr())
	err = http.ListenAndServe(addr, newHandler(s, d.Backend(), log))
	return errors.Join(err, s.close(), d.Close())
}
