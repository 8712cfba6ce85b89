package main

import "fmt"

// perfTargets adds the performance targets (issue 14) to the targets table: the uncontended
// and many-key paths against the raw floor and the best peer (every polling peer runs at
// retry delays of 1, 10 and 100 ms, so the best peer is at its best setting), the contended
// FIFO with and without cohorting, and memory under 10k waiters.
func (rp *report) perfTargets(row func(t, d, ref, res string)) {
	ok := func(r *runResult) bool { return r != nil && r.Failed == "" }
	for _, sc := range []struct{ id, label string }{{"uncontended", "uncontended 1×1"}, {"uncontended-1x8", "uncontended 1×8"}} {
		d, raw, bp := rp.find(sc.id, "dlock"), rp.find(sc.id, "raw"), rp.bestPeer(sc.id)
		if !ok(d) {
			continue
		}
		if ok(raw) {
			row(sc.label+": ops/s vs raw SET NX PX + DEL (≥ 0.95×)", fmt.Sprintf("%.0f", d.OpsPerSec), fmt.Sprintf("raw %.0f", raw.OpsPerSec),
				ratio(d.OpsPerSec, raw.OpsPerSec)+", "+check(d.OpsPerSec >= 0.95*raw.OpsPerSec))
			row(sc.label+": Redis CPU µs/acq vs raw (≤ 1.3×)", fmt.Sprintf("%.1f", d.RedisCPUUsPerAcq), fmt.Sprintf("raw %.1f", raw.RedisCPUUsPerAcq),
				ratio(d.RedisCPUUsPerAcq, raw.RedisCPUUsPerAcq)+", "+check(d.RedisCPUUsPerAcq <= 1.3*raw.RedisCPUUsPerAcq))
		}
		if bp != nil {
			row(sc.label+": ops/s vs best peer (≥ 1.0×)", fmt.Sprintf("%.0f", d.OpsPerSec), fmt.Sprintf("%s %.0f", bp.Library, bp.OpsPerSec),
				ratio(d.OpsPerSec, bp.OpsPerSec)+", "+check(d.OpsPerSec >= bp.OpsPerSec))
		}
	}
	if d, bp := rp.find("independent", "dlock"), rp.bestPeer("independent"); ok(d) && bp != nil {
		row("independent keys 1×64: ops/s vs best peer (≥ 1.0×)", fmt.Sprintf("%.0f", d.OpsPerSec), fmt.Sprintf("%s %.0f", bp.Library, bp.OpsPerSec),
			ratio(d.OpsPerSec, bp.OpsPerSec)+", "+check(d.OpsPerSec >= bp.OpsPerSec))
	}
	if d, bp := rp.find("contended-4x8", "dlock"), rp.bestPeer("contended-4x8"); ok(d) && bp != nil {
		row("contended 4×8: ops/s vs best peer (≥ 1.8×)", fmt.Sprintf("%.0f", d.OpsPerSec), fmt.Sprintf("%s %.0f", bp.Library, bp.OpsPerSec),
			ratio(d.OpsPerSec, bp.OpsPerSec)+", "+check(d.OpsPerSec >= 1.8*bp.OpsPerSec))
		row("contended 4×8: wait p99 (≤ 20 ms), Jain (≥ 0.99)", fmtUs(d.WaitP99us)+", "+fmt.Sprintf("%.3f", d.Jain), "",
			check(d.WaitP99us <= 20000 && d.Jain >= 0.99))
	}
	if n := rp.find("contended-4x8", "dlock-nocohort"); ok(n) {
		row("WithoutCohort 4×8: Redis CPU µs/acq (≤ 100)", fmt.Sprintf("%.1f", n.RedisCPUUsPerAcq), "", check(n.RedisCPUUsPerAcq <= 100))
		if pg := rp.find("contended-4x8", "pg"); ok(pg) {
			row("WithoutCohort 4×8: ops/s vs PostgreSQL advisory locks (≥ 1.0×)", fmt.Sprintf("%.0f", n.OpsPerSec), fmt.Sprintf("pg %.0f", pg.OpsPerSec),
				ratio(n.OpsPerSec, pg.OpsPerSec)+", "+check(n.OpsPerSec >= pg.OpsPerSec))
		}
	}
	// The rueidis adapter (dlockrueidis): the same dlock with its scripts on rueidis.
	for _, sc := range []struct{ id, label string }{{"uncontended", "uncontended 1×1"}, {"uncontended-1x8", "uncontended 1×8"},
		{"independent", "independent keys 1×64"}, {"contended-4x8", "contended 4×8"}} {
		d, r := rp.find(sc.id, "dlock"), rp.find(sc.id, "dlock-rueidis")
		if !ok(d) || !ok(r) {
			continue
		}
		row(sc.label+": dlock-rueidis ops/s vs dlock on go-redis", fmt.Sprintf("%.0f", r.OpsPerSec), fmt.Sprintf("dlock %.0f", d.OpsPerSec),
			ratio(r.OpsPerSec, d.OpsPerSec))
		if bp := rp.bestPeer(sc.id); bp != nil && sc.id != "contended-4x8" {
			row(sc.label+": dlock-rueidis ops/s vs best peer (≥ 1.0×)", fmt.Sprintf("%.0f", r.OpsPerSec), fmt.Sprintf("%s %.0f", bp.Library, bp.OpsPerSec),
				ratio(r.OpsPerSec, bp.OpsPerSec)+", "+check(r.OpsPerSec >= bp.OpsPerSec))
		}
	}
	if r := rp.find(memoryID, "dlock"); ok(r) && r.Memory != nil {
		m := r.Memory
		added := float64(m.RSSWaitingKB-m.RSSBeforeKB) / 1024
		row(fmt.Sprintf("memory, %d waiters on %d keys: waiting conns (≤ 2), RSS added (< 64 MB)", r.Goroutines, memoryKeys),
			fmt.Sprintf("%d conns, +%.1f MB", m.ConnsWaiting, added), "", check(m.ConnsWaiting <= 2 && added < 64))
	}
}
