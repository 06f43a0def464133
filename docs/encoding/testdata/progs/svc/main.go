// Command svc is the "average" corpus's workload: a small HTTP service whose handlers
// do what typical services do (decode a request, validate, render JSON and HTML,
// hash, compress), loaded by its own bounded client in a second process.
//
//	svc -listen 127.0.0.1:18080            # the server, the process sonde samples
//	svc -load http://127.0.0.1:18080 -for 15s -workers 4
package main

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"html/template"
	"io"
	"log"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

type order struct {
	ID    int               `json:"id"`
	User  string            `json:"user"`
	Items []item            `json:"items"`
	Tags  map[string]string `json:"tags"`
}

type item struct {
	SKU   string  `json:"sku"`
	Qty   int     `json:"qty"`
	Price float64 `json:"price"`
}

var page = template.Must(template.New("p").Parse(`<html><body><h1>{{.User}}</h1><ul>{{range .Items}}<li>{{.SKU}} x{{.Qty}} = {{.Price}}</li>{{end}}</ul></body></html>`))

func decode(r *http.Request) (order, error) {
	var o order
	err := json.NewDecoder(r.Body).Decode(&o)
	return o, err
}

func validate(o order) error {
	if o.User == "" || len(o.Items) == 0 {
		return fmt.Errorf("empty order")
	}
	sort.Slice(o.Items, func(i, j int) bool { return o.Items[i].SKU < o.Items[j].SKU })
	return nil
}

func total(o order) float64 {
	var t float64
	for _, it := range o.Items {
		t += float64(it.Qty) * it.Price
	}
	return t
}

func handleOrder(w http.ResponseWriter, r *http.Request) {
	o, err := decode(r)
	if err == nil {
		err = validate(o)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sum := sha256.New()
	json.NewEncoder(sum).Encode(o)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"id": o.ID, "total": total(o), "digest": hex.EncodeToString(sum.Sum(nil))})
}

func handlePage(w http.ResponseWriter, r *http.Request) {
	o, err := decode(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var buf bytes.Buffer
	page.Execute(&buf, o)
	w.Header().Set("Content-Encoding", "gzip")
	zw := gzip.NewWriter(w)
	zw.Write(buf.Bytes())
	zw.Close()
}

func handleSearch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("q")
	var hits []string
	for i := 0; i < 2000; i++ {
		s := fmt.Sprintf("product-%d-%s", i, strings.Repeat("x", i%7))
		if strings.Contains(s, q) {
			hits = append(hits, s)
		}
	}
	json.NewEncoder(w).Encode(hits)
}

// Middleware as most services stack it: each adds a frame or two under every handler.
func withRecover(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				http.Error(w, fmt.Sprint(v), http.StatusInternalServerError)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) { s.status = code; s.ResponseWriter.WriteHeader(code) }

var (
	mu       sync.Mutex
	requests = map[string]int{}
	latency  = map[string]time.Duration{}
)

func withMetrics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: 200}
		next.ServeHTTP(sw, r)
		key := fmt.Sprintf("%s %s %d", r.Method, r.URL.Path, sw.status)
		mu.Lock()
		requests[key]++
		latency[key] += time.Since(start)
		mu.Unlock()
	})
}

func withRequestID(next http.Handler) http.Handler {
	var n uint64
	var idMu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idMu.Lock()
		n++
		id := n
		idMu.Unlock()
		w.Header().Set("X-Request-Id", fmt.Sprintf("%016x", id))
		next.ServeHTTP(w, r)
	})
}

func serve(addr string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/order", handleOrder)
	mux.HandleFunc("/page", handlePage)
	mux.HandleFunc("/search", handleSearch)
	log.Fatal(http.ListenAndServe(addr, withRecover(withRequestID(withMetrics(mux)))))
}

func body(n int) []byte {
	o := order{ID: n, User: fmt.Sprintf("user%d", n%97), Tags: map[string]string{"region": "eu", "tier": "gold"}}
	for i := 0; i < 5+n%20; i++ {
		o.Items = append(o.Items, item{SKU: fmt.Sprintf("sku-%05d", (n*31+i*17)%10000), Qty: 1 + i%4, Price: float64(i) * 1.25})
	}
	b, _ := json.Marshal(o)
	return b
}

// load sends requests until the deadline; bounded in time so it stops by itself.
func load(base string, d time.Duration, workers int) {
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second}
			for n := w; time.Now().Before(deadline); n += workers {
				var resp *http.Response
				var err error
				switch n % 3 {
				case 0:
					resp, err = c.Post(base+"/order", "application/json", bytes.NewReader(body(n)))
				case 1:
					resp, err = c.Post(base+"/page", "application/json", bytes.NewReader(body(n)))
				default:
					resp, err = c.Get(fmt.Sprintf("%s/search?q=%d", base, n%100))
				}
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}(w)
	}
	wg.Wait()
}

func main() {
	listen := flag.String("listen", "", "serve on this address")
	target := flag.String("load", "", "load this base URL")
	dur := flag.Duration("for", 15*time.Second, "how long to load")
	workers := flag.Int("workers", 4, "concurrent clients")
	flag.Parse()
	switch {
	case *listen != "":
		serve(*listen)
	case *target != "":
		load(*target, *dur, *workers)
	default:
		log.Fatal("want -listen or -load")
	}
}
