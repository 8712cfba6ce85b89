package main

import (
	"context"
	"fmt"
	"strings"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// toxics runs toxiproxy in this process: TCP proxies between the client processes and a
// Redis, on which the nemesis turns network faults on and off.
type toxics struct {
	srv *toxiproxy.ApiServer
	n   int
}

func newToxics() *toxics {
	return &toxics{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())}
}

// proxy starts a proxy to upstream (host:port) on a free loopback port.
func (t *toxics) proxy(upstream string) (*toxiproxy.Proxy, error) {
	t.n++
	p := toxiproxy.NewProxy(t.srv, fmt.Sprintf("p%d", t.n), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("toxiproxy: %w", err)
	}
	return p, nil
}

// addToxic adds a toxic given as toxiproxy's JSON, e.g.
// {"name":"lat","type":"latency","stream":"downstream","attributes":{"latency":300}}.
func addToxic(p *toxiproxy.Proxy, js string) error {
	_, err := p.Toxics.AddToxicJson(strings.NewReader(js))
	return err
}

func removeToxic(p *toxiproxy.Proxy, name string) {
	_ = p.Toxics.RemoveToxic(context.Background(), name)
}

func proxyURL(p *toxiproxy.Proxy) string { return "redis://" + p.Listen }
