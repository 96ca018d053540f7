package main

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/xseg-dev/xseg/metrics"
	"github.com/xseg-dev/xseg/vmm"
)

// newHandler serves the store: POST /append, GET /vector?i=N, GET /stats
// (JSON) and GET /metrics (Prometheus).
func newHandler(s *store, backend string, log *slog.Logger) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(s.buf, prometheus.Labels{"device": "0", "backend": backend}))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /append", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Vectors [][]float32 `json:"vectors"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		first, err := s.add(req.Vectors)
		if err != nil {
			log.Warn("append failed", "err", err)
			http.Error(w, err.Error(), status(err))
			return
		}
		log.Debug("appended", "first", first, "count", len(req.Vectors), metrics.Attr("xseg", s.buf.Stats()))
		reply(w, map[string]int{"first": first, "count": len(req.Vectors)})
	})
	mux.HandleFunc("GET /vector", func(w http.ResponseWriter, r *http.Request) {
		i, err := strconv.Atoi(r.URL.Query().Get("i"))
		if err != nil {
			http.Error(w, "want ?i=<index>", http.StatusBadRequest)
			return
		}
		v, err := s.get(i)
		if err != nil {
			http.Error(w, err.Error(), status(err))
			return
		}
		reply(w, v)
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, map[string]any{
			"vectors": s.count(), "dim": s.dim, "backend": backend,
			"address": s.buf.Ptr().String(), "len": s.buf.Len(), "cap": s.buf.Cap(), "max": s.buf.Max(),
			"stats": s.buf.Stats(),
		})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

func status(err error) int {
	switch {
	case errors.Is(err, vmm.ErrOutOfMemory):
		return http.StatusInsufficientStorage
	case errors.Is(err, vmm.ErrInvalid):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
