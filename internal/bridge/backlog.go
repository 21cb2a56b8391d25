package bridge

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// shardBacklog is student_bridge_shard_unpublished: per shard this replica
// holds, the changes seen and not yet published. It is counted when
// scraped, from the cache and the records, so a shard given up disappears
// from it at once. Every running bridge of the process adds its count.
var shardBacklog = &backlogCollector{
	desc: prometheus.NewDesc("student_bridge_shard_unpublished",
		"Changes seen and not yet published, per shard held here: Students whose state differs from their last published event, and deletions not yet published. The shard's backlog; 0 when it keeps up.",
		[]string{"shard"}, nil),
	sources: map[*backlogSource]struct{}{},
}

// backlogSource is one bridge's count: held lists its shards, count their
// backlogs (shards without one may be missing).
type backlogSource struct {
	held  func() []int
	count func(context.Context) (map[int]int, error)
}

type backlogCollector struct {
	desc    *prometheus.Desc
	mu      sync.Mutex
	sources map[*backlogSource]struct{}
}

// add counts src until the returned function is called.
func (c *backlogCollector) add(src *backlogSource) (remove func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources[src] = struct{}{}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.sources, src)
	}
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := make([]*backlogSource, 0, len(c.sources))
	for src := range c.sources {
		sources = append(sources, src)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	total := map[int]int{}
	for _, src := range sources {
		counts, err := src.count(ctx)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.desc, err)
			continue
		}
		for _, n := range src.held() {
			total[n] += counts[n]
		}
	}
	for n, v := range total {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), strconv.Itoa(n))
	}
}
